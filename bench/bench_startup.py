"""Benchmark: CPU and wall time of orch commands that start nothing, per source tree.

Each command runs as a fresh process (`python -c` importing `orchestrator.cli.main` from
the given tree, which is what the `orch` entry point does), the trees alternating, and
the process's own CPU (user + system, from wait4) is reported: CPU, unlike wall time,
hardly moves with the machine's load. Compare trees with `git worktree add`:

    git worktree add /tmp/orch-before <commit>
    .venv/bin/python bench/bench_startup.py --tree before=/tmp/orch-before --tree after=.

Run: .venv/bin/python bench/bench_startup.py [--tree NAME=PATH ...] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    PYTHON,
    ROOT,
    Sample,
    alternation,
    command_line,
    machine,
    machine_line,
    now_utc,
    render_table,
    summarize,
    write_results,
)

HOSTFILE = ROOT / "hostfiles" / "example-2x8"
COMMANDS = {
    "standard --dry-run": ["launch", "--hostfile", str(HOSTFILE), "--launcher", "standard",
                           "--main-port", "29500", "--dry-run", "train.py"],
    "pdsh --dry-run": ["launch", "--hostfile", str(HOSTFILE), "--main-port", "29500",
                       "--dry-run", "train.py"],
    "--help": ["--help"],
}  # fmt: skip
# The tree first on the path, and the venv's editable-install finder (which would import
# the working copy whatever the path says) out of the way.
_FROM_TREE = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in f.__module__]; "
)
_ENTRY = _FROM_TREE + "sys.argv[0] = 'orch'; from orchestrator.cli.main import main; main()"


def run_once(tree: Path, args: list[str]) -> Sample:
    env = dict(os.environ, ORCH_RUNS_DIR=tempfile.mkdtemp())
    started = time.monotonic()
    proc = subprocess.Popen([PYTHON, "-c", _ENTRY, str(tree), *args], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    note = "" if code == 0 else f"exit {code}: {proc.stderr.read().decode()[-200:]}"
    return Sample(wall=wall, cpu=usage.ru_utime + usage.ru_stime, ok=code == 0, note=note)


def imported_from(tree: Path) -> str:
    code = _FROM_TREE + "import orchestrator, os; print(os.path.dirname(orchestrator.__file__))"
    return subprocess.run([PYTHON, "-c", code, str(tree)], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree) or {"this": str(ROOT)}
    for name, path in trees.items():
        where = imported_from(Path(path).resolve())
        if not where.startswith(str(Path(path).resolve())):
            print(f"{name}: orchestrator imports from {where}, not {path}", file=sys.stderr)
            return 1
    info = machine()
    print(machine_line(info))
    results: dict[str, dict[str, list[Sample]]] = {c: {t: [] for t in trees} for c in COMMANDS}
    for command, argv in COMMANDS.items():
        for _rep, tree in alternation(list(trees), args.reps):
            results[command][tree].append(run_once(Path(trees[tree]).resolve(), argv))
    rows = []
    for command, per_tree in results.items():
        for tree, samples in per_tree.items():
            ok = [s for s in samples if s.ok]
            rows.append([command, tree, summarize([s.cpu for s in ok]).text(2),
                         summarize([s.wall for s in ok]).text(2), f"{len(ok)}/{len(samples)}"])
    table = render_table(["command", "tree", "CPU s, median (min-max)",
                          "wall s, median (min-max)", "ok"], rows)  # fmt: skip
    print(table)
    path = write_results("startup", {"command": command_line(), "at": now_utc(),
                                     "machine": info, "trees": trees, "results": results})
    print(f"results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
