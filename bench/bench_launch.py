"""Benchmark: launch overhead of the cpu-smoke job, orch against the field's own tools.

For each cluster size (its own private sandbox, 2 ranks per node) the methods run
alternating, several repetitions, all on the same sandbox in the same run:

- accelerate: `accelerate launch --config_file <hand-written pdsh config> job.py`
  (the seed recipe: DeepSpeed's runner fans out through pdsh);
- deepspeed: `deepspeed --hostfile H --master_addr <node 0> job.py`;
- orch: `orch launch --hostfile H --no-doctor -- job.py` (pre-flight excluded);
- orch+doctor: `orch launch --hostfile H -- job.py` (pre-flight included).

Each run is the whole job, start to exit, as a user times it; the job itself
(bench/jobs/cpu_smoke.py, accelerate + DeepSpeed ZeRO-2 on CPU with gloo) is the
same for every method, so differences are launch overhead. Head CPU is the
getrusage(RUSAGE_CHILDREN) delta of each run. Ratios against accelerate are the
headline. orch is measured only when `orch launch` exists in this checkout.

Run: .venv/bin/python bench/bench_launch.py [--sizes 2,4] [--reps 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    JOB_SCRIPT,
    Budget,
    Sample,
    command_line,
    exit_cleanly_on_sigterm,
    head_env,
    kill_token,
    launcher_argv,
    machine,
    machine_line,
    now_utc,
    orch_launch_available,
    prepare_workdir,
    print_header,
    private_sandbox,
    ratio,
    ratio_text,
    render_table,
    run_alternating,
    run_timed,
    summarize,
    warm_up_job_ops,
    write_results,
)
from orchestrator.sandbox.state import SandboxState

SLOTS = 2
RUN_TIMEOUT_S = 600.0
PLAIN_METHODS = ("accelerate", "deepspeed")
ORCH_METHODS = ("orch", "orch+doctor")


class Launches:
    """Builds and runs one launch of each method on one sandbox."""

    def __init__(self, state: SandboxState, base: Path, steps: int) -> None:
        self.state = state
        self.base = base
        self.steps = steps
        self.world = len(state.nodes) * SLOTS
        self.port = 29600 + uuid.uuid4().int % 200 * 10
        self.count = 0

    def _job_args(self, token: str) -> list[str]:
        return [str(JOB_SCRIPT), "--steps", str(self.steps), "--token", token]

    def _next_port(self) -> int:
        # A fresh port per run: the last run's sockets may linger in TIME_WAIT.
        self.count += 1
        return self.port + self.count

    def argv(self, method: str, token: str, workdir: Path) -> list[str]:
        return launcher_argv(
            method, self.state, job=self._job_args(token), workdir=workdir,
            port=self._next_port(), runs_dir=self.base / "runs", processes_per_node=SLOTS,
        )  # fmt: skip

    def run(self, method: str) -> Sample:
        token = f"bench-launch-{uuid.uuid4().hex[:10]}"
        workdir = prepare_workdir(self.base, method.replace("+", "-"))
        log = self.base / f"{method.replace('+', '-')}-{self.count + 1}.log"
        done = run_timed(
            self.argv(method, token, workdir),
            cwd=workdir, env=head_env(), timeout=RUN_TIMEOUT_S, log=log,
        )  # fmt: skip
        leftovers = kill_token(token)
        ranks_done = done.output.count(" done: loss=")
        ok = done.code == 0
        note = f"exit {done.code}, {ranks_done}/{self.world} ranks reported done"
        if leftovers:
            note += f", {leftovers} processes left behind (killed)"
        if not ok:
            print(f"  {method}: FAILED ({note}); log: {log}", file=sys.stderr)
        return Sample(wall=done.wall, cpu=done.cpu, ok=ok, note=note)


def bench_size(
    nodes: int, reps: int, steps: int, methods: tuple[str, ...], budget: Budget
) -> dict[str, list[Sample]]:
    with private_sandbox(nodes, SLOTS, tag="bl") as state:
        base = Path(tempfile.mkdtemp(prefix=f"orch-bench-launch-{nodes}-"))
        launches = Launches(state, base, steps)
        return run_alternating(methods, reps, budget, launches.run, label=f"{nodes} nodes ")


def table_rows(results: dict[int, dict[str, list[Sample]]]) -> list[list[object]]:
    rows: list[list[object]] = []
    for nodes, by_method in results.items():
        plain = [s for s in by_method.get("accelerate", []) if s.ok]
        base, base_cpu = (
            summarize([s.wall for s in plain]).median,
            summarize([s.cpu for s in plain]).median,
        )
        base_ds = summarize([s.wall for s in by_method.get("deepspeed", []) if s.ok]).median
        for method, samples in by_method.items():
            good = [s for s in samples if s.ok]
            wall = summarize([s.wall for s in good])
            cpu = summarize([s.cpu for s in good])
            rows.append([
                nodes, f"{nodes * SLOTS}", method, wall.text(), cpu.text(),
                ratio_text(ratio(wall.median, base)), ratio_text(ratio(wall.median, base_ds)),
                ratio_text(ratio(cpu.median, base_cpu)), f"{len(good)}/{len(samples)}",
            ])  # fmt: skip
    return rows


HEADERS = [
    "nodes", "ranks", "method", "wall s, median (min-max)", "head CPU s, median (min-max)",
    "wall / accelerate", "wall / deepspeed", "head CPU / accelerate", "ok runs",
]  # fmt: skip


def table_from_file(path: str) -> str:
    """The table of an earlier run, from its results file."""
    saved = json.loads(Path(path).read_text())
    results = {
        int(nodes): {m: [Sample(**s) for s in samples] for m, samples in by_method.items()}
        for nodes, by_method in saved["results"].items()
    }
    return render_table(HEADERS, table_rows(results))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4", help="comma-separated node counts")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps of the job")
    parser.add_argument("--cap", type=float, default=3600.0, help="total time cap, seconds")
    parser.add_argument("--quick", action="store_true", help="2 nodes, 1 repetition")
    parser.add_argument("--table", metavar="RESULTS", help="print the table of a results file")
    parser.add_argument(
        "--methods", default="", help="comma-separated subset of: " + ",".join(
            PLAIN_METHODS + ORCH_METHODS)
    )  # fmt: skip
    return parser.parse_args()


def choose_methods(requested: str, have_orch: Callable[[], bool]) -> tuple[str, ...]:
    if requested:
        return tuple(m.strip() for m in requested.split(",") if m.strip())
    return PLAIN_METHODS + (ORCH_METHODS if have_orch() else ())


def main() -> None:
    exit_cleanly_on_sigterm()
    args = parse_args()
    if args.table:
        print(table_from_file(args.table))
        return
    sizes = [2] if args.quick else [int(s) for s in args.sizes.split(",")]
    reps = 1 if args.quick else args.reps
    methods = choose_methods(args.methods, orch_launch_available)
    info = machine()
    print_header("launch overhead: cpu-smoke job", info)
    print(f"methods: {', '.join(methods)}; sizes: {sizes}; reps: {reps}", flush=True)
    print(f"warm-up (DeepSpeed CPU op build/load): {warm_up_job_ops():.1f} s", flush=True)
    budget = Budget(args.cap)
    results: dict[int, dict[str, list[Sample]]] = {}
    for nodes in sizes:
        if budget.expired():
            break
        results[nodes] = bench_size(nodes, reps, args.steps, methods, budget)
    table = render_table(HEADERS, table_rows(results))
    print(table)
    path = write_results(
        "launch",
        {
            "benchmark": "launch",
            "date": now_utc(),
            "command": command_line(),
            "machine": info,
            "machine_line": machine_line(info),
            "methods": methods,
            "reps": reps,
            "steps": args.steps,
            "results": {str(n): by_method for n, by_method in results.items()},
            "table": table,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
