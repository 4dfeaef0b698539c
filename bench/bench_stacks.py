"""The cost of `orch stacks` on many ranks: 8 sandbox nodes x 8 ranks (64) waiting, every
rank's stack taken by each method in turn, alternating, several repetitions.

Methods:
- py-spy:       `orch stacks JOB --json --method py-spy` (ptrace, one py-spy per rank)
- faulthandler: `orch stacks JOB --json --method faulthandler` (no ptrace: each rank
                dumps its own stack on SIGUSR2 from the handler orch-rank registered)

Wall time is the whole `orch stacks` call, as a user waits for it. Head CPU is
getrusage(RUSAGE_CHILDREN) of the call (orch's process and its ssh). Machine CPU is the
busy time of the whole machine during the call, from /proc/stat: every sandbox node
runs here, so it also holds the nodes' side (sshd, the stacks program, py-spy). Ranks
seen: the ranks the answer names with a stack, of nodes x slots.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ORCH,
    ROOT,
    Budget,
    Sample,
    command_line,
    head_env,
    kill_session,
    machine,
    machine_line,
    now_utc,
    print_header,
    private_sandbox,
    ratio,
    ratio_text,
    render_table,
    run_alternating,
    run_timed,
    summarize,
    write_results,
)

JOB = ROOT / "bench" / "jobs" / "idle_rank.py"
METHODS = ("py-spy", "faulthandler")
START_TIMEOUT_S = 600.0


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(v) for v in fields[:8]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def start_job(state, base: Path, slots: int) -> tuple[subprocess.Popen, str, Path, Path]:
    runs, stop = base / "runs", base / "stop"
    argv = [
        ORCH, "launch", "--hostfile", state.hostfile, "--launcher", "torchrun",
        "--nproc-per-node", str(slots), "--no-doctor", "--runs-dir", str(runs), "--quiet",
        str(JOB), "--", "--stop-file", str(stop),
    ]  # fmt: skip
    out = (base / "launch.out").open("wb")
    head = subprocess.Popen(argv, cwd=base, env=head_env(), stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        jobs = [p.name for p in runs.glob("*") if (p / "job.json").exists()]
        up = sum(p.read_text(errors="replace").count(" up on ")
                 for p in runs.glob("*/logs/*.log")) if jobs else 0  # fmt: skip
        if jobs and up == len(state.nodes) * slots:
            return head, jobs[0], runs, stop
        if head.poll() is not None:
            break
        time.sleep(1.0)
    kill_session(head)
    raise SystemExit(f"the job did not start: see {base / 'launch.out'}")


class StackRuns:
    def __init__(self, job_id: str, runs: Path, base: Path, ranks: int) -> None:
        self.job_id, self.runs, self.base, self.ranks = job_id, runs, base, ranks
        self.count = 0

    def run(self, method: str) -> Sample:
        self.count += 1
        log = self.base / f"stacks-{method}-{self.count}.json"
        busy0 = machine_busy_seconds()
        done = run_timed(
            [ORCH, "stacks", self.job_id, "--json", "--method", method, "--runs-dir",
             str(self.runs), "--timeout", "120"],
            cwd=self.base, env=head_env(), timeout=300, log=log,
        )  # fmt: skip
        busy = machine_busy_seconds() - busy0
        try:
            doc = json.loads(done.output)
            seen = sum(1 for n in doc["nodes"] for r in n["ranks"] if r["ok"])
        except (ValueError, KeyError):
            seen = 0
        ok = done.code == 0 and seen == self.ranks
        if not ok:
            print(f"  {method}: FAILED (exit {done.code}, {seen}/{self.ranks}); see {log}",
                  file=sys.stderr)  # fmt: skip
        return Sample(wall=done.wall, cpu=done.cpu, ok=ok, note=f"{seen}/{self.ranks} ranks",
                      extra={"machine_cpu": busy, "seen": seen, "ranks": self.ranks})  # fmt: skip


HEADERS = [
    "method", "ranks seen", "wall s, median (min-max)", "head CPU s, median (min-max)",
    "machine CPU s, median (min-max)", "wall vs py-spy", "ok runs",
]  # fmt: skip


def table_rows(samples: dict[str, list[Sample]]) -> list[list[object]]:
    good = {m: [s for s in runs if s.ok] for m, runs in samples.items()}
    wall = {m: summarize([s.wall for s in runs]) for m, runs in good.items()}
    rows = []
    for method, runs in samples.items():
        seen = sorted({f"{s.extra['seen']}/{s.extra['ranks']}" for s in runs})
        rows.append([
            method, ", ".join(seen), wall[method].text(),
            summarize([s.cpu for s in good[method]]).text(),
            summarize([s.extra["machine_cpu"] for s in good[method]]).text(),
            ratio_text(ratio(wall[method].median, wall["py-spy"].median))
            if "py-spy" in wall else "n/a",
            f"{len(good[method])}/{len(runs)}",
        ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--slots", type=int, default=8, help="ranks per node")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cap", type=float, default=1800.0, help="total time cap, seconds")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--quick", action="store_true", help="2 nodes x 2 ranks, 1 repetition")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.slots, args.reps = 2, 2, 1
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    info = machine()
    print_header("orch stacks: every rank's stack, many ranks", info)
    ranks = args.nodes * args.slots
    print(f"methods: {', '.join(methods)}; {args.nodes} nodes x {args.slots} ranks = {ranks}; "
          f"reps: {args.reps}", flush=True)  # fmt: skip
    budget = Budget(args.cap)
    with private_sandbox(args.nodes, args.slots, tag="st") as state:
        base = Path(tempfile.mkdtemp(prefix=f"orch-bench-stacks-{uuid.uuid4().hex[:6]}-"))
        head, job_id, runs, stop = start_job(state, base, args.slots)
        try:
            stack_runs = StackRuns(job_id, runs, base, ranks)
            samples = run_alternating(methods, args.reps, budget, stack_runs.run)
        finally:
            stop.touch()
            try:
                code = head.wait(120)
            except subprocess.TimeoutExpired:
                kill_session(head)
                code = None
    print(f"the job afterwards: exit {code}", flush=True)
    table = render_table(HEADERS, table_rows(samples))
    print(table)
    path = write_results("stacks", {
        "benchmark": "stacks", "date": now_utc(), "command": command_line(), "machine": info,
        "machine_line": machine_line(info), "methods": methods, "nodes": args.nodes,
        "slots": args.slots, "reps": args.reps, "job_exit": code, "results": samples,
        "table": table,
    })  # fmt: skip
    print(f"results: {path}")


if __name__ == "__main__":
    main()
