"""Benchmark: is the first failure named right, every time? And what does a rank's keeper cost?

One private sandbox of 2 nodes x 2 ranks. For each launcher, --runs jobs of the race that
decides the root cause: the last rank (rank 3, on the second node) calls os._exit(7) after
five all_reduce steps of 20 ms, while its peers on both nodes wait in one more all_reduce;
they lose it, print gloo's traceback and exit 1 at once (tests/jobs/allreduce.py
--peers-exit-at-once), milliseconds later. A run is right when the job exits 7 and the
summary names rank 3 on the second node with "exited with code 7".

--tree DIR runs another checkout's orch (`python -m orchestrator` with DIR first on
PYTHONPATH), so a tree before a change and after it are counted on one machine.

Then the keeper's cost: every rank's orch-rank stays its parent (remote/rank.py); its
resident memory is read from /proc while a job's ranks run.

Run: .venv/bin/python bench/bench_first_failure.py [--runs 20] [--launchers pdsh,standard,torchrun]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    PYTHON,
    ROOT,
    command_line,
    head_env,
    machine,
    machine_line,
    now_utc,
    print_header,
    private_sandbox,
    render_table,
    run_timed,
    write_results,
)

JOB = ROOT / "tests" / "jobs" / "allreduce.py"
RACE = ("--steps", "5", "--step-sleep", "0.02", "--peers-exit-at-once", "--fail-rank", "3",
        "--exit-code", "7")  # fmt: skip


def _orch(tree: Path | None) -> tuple[list[str], dict[str, str]]:
    if tree is None:
        return [str(ROOT / ".venv" / "bin" / "orch")], head_env()
    return [PYTHON, "-m", "orchestrator"], head_env({"PYTHONPATH": str(tree)})


def _launch(hostfile: str, launcher: str, runs: Path, *job_args: str) -> list[str]:
    return ["launch", "--hostfile", hostfile, "--launcher", launcher, "--nproc-per-node", "2",
            "--no-doctor", "--runs-dir", str(runs), str(JOB), "--", *job_args]  # fmt: skip


def count_right(hostfile: str, second_node: str, launcher: str, runs: int,
                tree: Path | None) -> dict[str, object]:  # fmt: skip
    """Run the race `runs` times; how often the job exited 7 naming rank 3."""
    orch, env = _orch(tree)
    right, seen = 0, []
    expected = f"first failure: {second_node} rank 3: exited with code 7"
    with tempfile.TemporaryDirectory() as work:
        for attempt in range(runs):
            argv = [*orch, *_launch(hostfile, launcher, Path(work) / f"r{attempt}", *RACE)]
            done = run_timed(argv, cwd=Path(work), env=env, timeout=300)
            named = re.search(r"first failure: (\S+ rank \d+: [^\n]*)", done.output)
            ok = done.code == 7 and expected in done.output
            right += ok
            seen.append(f"exit {done.code}: {named.group(1) if named else '?'}")
            print(f"  {launcher} run {attempt + 1}/{runs}: {'right' if ok else 'WRONG'} "
                  f"({seen[-1]})", flush=True)  # fmt: skip
    return {"launcher": launcher, "runs": runs, "right": right, "outcomes": seen}


def _keeper_rss_kb() -> list[int]:
    """VmRSS of every orch-rank keeper running on this machine (the sandbox's nodes too)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if b"orch_rank.py" not in cmdline:
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        rss = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        if rss:
            found.append(int(rss.group(1)))
    return found


def keeper_memory(hostfile: str) -> dict[str, object]:
    """The keepers' resident memory while a 2x2 job's ranks sleep."""
    orch, env = _orch(None)
    with tempfile.TemporaryDirectory() as work:
        argv = [*orch, *_launch(hostfile, "pdsh", Path(work) / "runs", "--sleep", "20")]
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        samples: list[int] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(samples) < 4 and proc.poll() is None:
            samples = _keeper_rss_kb()
            time.sleep(0.5)
        time.sleep(2)
        samples = _keeper_rss_kb() or samples
        proc.wait(120)
    return {"keepers": len(samples), "rss_kb": sorted(samples)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--launchers", default="pdsh,standard,torchrun")
    parser.add_argument("--tree", type=Path, help="another checkout's orch to count")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    info = machine()
    print_header("first failure: the race, counted", info)
    results = []
    with private_sandbox(2, 2, tag="first") as state:
        second = state.nodes[1].name
        for launcher in args.launchers.split(","):
            results.append(count_right(state.hostfile, second, launcher, args.runs, args.tree))
        memory = None if args.no_memory or args.tree else keeper_memory(state.hostfile)
    rows = [(r["launcher"], f"{r['right']}/{r['runs']}") for r in results]
    print(render_table(["launcher", "exit 7, rank 3 named"], rows))
    if memory:
        print(f"keepers seen: {memory['keepers']}, resident memory (kB): {memory['rss_kb']}")
    path = write_results("first_failure", {
        "when": now_utc(), "machine": info, "machine_line": machine_line(info),
        "command": command_line(), "tree": str(args.tree or ROOT), "results": results,
        "keeper_memory": memory,
    })  # fmt: skip
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
