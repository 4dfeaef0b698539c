"""Benchmark: `orch env push` of a real environment to sandbox nodes with storage of their
own: a first push to nodes that had nothing, then a push with nothing changed.

The environment is a venv made from this project's base interpreter holding a copy of the
project venv's site-packages (torch, deepspeed, accelerate, transformers...). Each size
gets a private sandbox whose nodes each have an empty directory of their own where the
environment goes (bind-mounted in the node's mount namespace). Wall time (CLI start-up
included), head CPU, and the bytes the head sent, from `--json`.

Run: .venv/bin/python bench/bench_envpush.py [--sizes 1,3] [--work /tmp/orch-bench-env]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ORCH, ROOT, head_env, private_sandbox, run_timed, sandbox_of


def make_environment(work: Path) -> Path:
    """work/envs/big: a venv of this project's base interpreter with the project's packages."""
    root = work / "envs" / "big"
    if root.exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)],
                   check=True, timeout=300)  # fmt: skip
    ours = next((ROOT / ".venv").glob("lib/python*/site-packages"))
    theirs = next(root.glob("lib/python*/site-packages"))
    shutil.rmtree(theirs)
    shutil.copytree(ours, theirs, symlinks=True)
    return root


def push_once(hostfile: Path, root: Path, work: Path) -> dict[str, object]:
    argv = [ORCH, "env", "push", "--hostfile", str(hostfile), "--python",
            str(root / "bin" / "python"), "--json"]  # fmt: skip
    done = run_timed(argv, cwd=work, env=head_env(), timeout=3600)
    report = json.loads(done.output[done.output.index("{"):])
    return {"code": done.code, "wall": round(done.wall, 1), "head_cpu": round(done.cpu, 1),
            "payload_mib": report["payload_bytes"] >> 20,
            "head_sent_mib": round(report["head_sent_bytes"] / 2**20, 1),
            "ok": all(n["ok"] for n in report["nodes"]),
            "problems": [n["problem"] for n in report["nodes"] if not n["ok"]][:3]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,3")
    parser.add_argument("--work", default="/tmp/orch-bench-env")
    args = parser.parse_args()
    work = Path(args.work)
    root = make_environment(work)
    for size in (int(s) for s in args.sizes.split(",")):
        with private_sandbox(size, 1, tag="envpush") as state:
            box = sandbox_of(state)
            for node in state.nodes:
                box.private_directory(node.name, root.parent)
            for run in ("first", "no-change"):
                measured = push_once(Path(state.hostfile), root, work)
                print(json.dumps({"nodes": size, "push": run, **measured}), flush=True)


if __name__ == "__main__":
    main()
