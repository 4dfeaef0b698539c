"""The head's side of the log path alone, replayed in one process: CPU per line.

What `orch launch`'s watch loop does with the fan-out's output, without the nodes: the
output of 2 nodes x 1 rank printing LINES numbered lines each (and a tqdm frame every 500
lines, on stderr) as wire lines behind pdsh's `node: ` prefix, in 64 KiB chunks, fed to the
LogRouter with the output tracker as its view (and, in a tree that keeps them, the
progress samples), the tracker's events read after each chunk, as JobRunner._watch does.
Each `--tree NAME=PATH` runs in a fresh process with PYTHONPATH=PATH, trees alternating,
REPS each; the figure is that process's CPU time for the replay (not its start-up), so the
nodes' work and the machine's other load weigh far less than in bench_logs.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 64 * 1024


def pdsh_output(lines: int) -> bytes:
    """What pdsh prints for 2 nodes of 1 rank each, their lines interleaved."""
    out = []
    for i in range(lines):
        for node, rank in (("n1", 0), ("n2", 1)):
            out.append(b"%s: %%o1Lo:%d/0 r%d step %d loss 0.123456 lr 0.000100"
                       % (node.encode(), rank, rank, i))  # fmt: skip
            if i % 500 == 0:
                out.append(b"%s: %%o1Fe:%d/0  %3d%%|#   | %d/%d [00:01<00:02, 9000.0it/s]"
                           % (node.encode(), rank, i * 100 // lines, i, lines))  # fmt: skip
    return b"\n".join(out) + b"\n"


def replay(data_file: str, workdir: str) -> tuple[float, bool]:
    """In the child: the replay's CPU seconds, and whether progress samples were kept."""
    from orchestrator.logs.router import LogRouter

    try:  # the tracker in its own module; an older tree keeps it in run/launch.py
        from orchestrator.logs.tracker import OutputTracker as Tracker
    except ImportError:
        from orchestrator.run.launch import _Tracker as Tracker

    hosts = ("n1", "n2")
    progress = None
    try:  # a tree that keeps progress samples: as JobRunner builds its tracker
        from orchestrator.logs.progress import ProgressRecorder

        try:  # a tree whose recorder writes in the job's directory, held open
            from orchestrator.records.rundir import RunDir

            where: object = RunDir(Path(workdir))
        except ImportError:  # an older one takes the file's path
            from orchestrator.records.job import PROGRESS_FILE

            where = Path(workdir) / PROGRESS_FILE
        progress = ProgressRecorder(where, now=time.time())
        tracker = Tracker(hosts, None, progress)
    except ImportError:
        tracker = Tracker(hosts, None)
    data = Path(data_file).read_bytes()
    router = LogRouter(Path(workdir) / "logs", view=tracker, nodes=hosts)
    start = time.process_time()
    for offset in range(0, len(data), CHUNK):
        if progress is not None:
            progress.now = time.time()
        router.feed(data[offset : offset + CHUNK])
        tracker.events(time.monotonic())
    router.close()
    if progress is not None:
        progress.close()
    return time.process_time() - start, progress is not None


def main() -> None:
    if sys.argv[1:2] == ["--child"]:  # the tree under test only: common.py is not imported
        print(json.dumps(replay(*sys.argv[2:4])))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    common = importlib.import_module("common")  # puts this checkout first on sys.path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--lines", type=int, default=200_000, help="lines per rank")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    trees = {name: str(Path(path).resolve()) for name, path in
             (tree.split("=", 1) for tree in args.tree)}  # fmt: skip
    info = common.machine()
    common.print_header("the head's log path replayed: CPU per line", info)
    base = Path(tempfile.mkdtemp(prefix="orch-bench-tracker-"))
    data = base / "pdsh.out"
    data.write_bytes(pdsh_output(args.lines))
    cpu: dict[str, list[float]] = {name: [] for name in trees}
    for rep in range(args.reps):
        order = list(trees)[rep % len(trees):] + list(trees)[: rep % len(trees)]
        for name in order:
            workdir = base / f"{name}-{rep}"
            workdir.mkdir()
            env = common.head_env({"PYTHONPATH": trees[name]})
            done = subprocess.run([common.PYTHON, __file__, "--child", str(data), str(workdir)],
                                  env=env, capture_output=True, text=True, check=True)  # fmt: skip
            seconds, kept = json.loads(done.stdout)
            cpu[name].append(seconds)
            sampled = "progress kept" if kept else "no progress kept"
            print(f"  rep {rep + 1} {name:8} {seconds:.3f} s CPU ({sampled})", flush=True)
    lines = 2 * args.lines
    rows = [[name, f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})",
             f"{statistics.median(v) / lines * 1e6:.2f}"] for name, v in cpu.items()]  # fmt: skip
    table = common.render_table(["tree", "CPU s, median (min-max)", "us per line"], rows)
    print(table)
    path = common.write_results("tracker", {
        "benchmark": "tracker", "date": common.now_utc(), "command": common.command_line(),
        "machine": info,
        "machine_line": common.machine_line(info), "trees": trees, "lines": lines, "results": cpu,
        "table": table,
    })  # fmt: skip
    print(f"results: {path}")


if __name__ == "__main__":
    main()
