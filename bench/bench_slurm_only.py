"""Benchmark: orch on a Slurm whose nodes refuse SSH, every node operation through srun,
and what each costs per node, for a projection to 1024 nodes.

One sandbox with Slurm and sshd that refuses every login (`orch sandbox up --slurm
--no-ssh`), one allocation of every node held for the whole run (`salloc --no-shell`);
everything below runs inside it, on k = 2, 4 ... N of its nodes, alternating:

- `step`: one node command on k nodes as orch sends it through Slurm when it is the same
  everywhere (one labelled srun step, a task per node);
- `steps`: the same as orch sends a command that differs per node (one srun step each, in
  parallel, as the job's settings and the raw logs go);
- `doctor`: `orch doctor --transport slurm` (probe, node 0's listener, the port);
- `launch`: `orch launch --transport slurm --launcher torchrun --no-doctor` of a small gloo
  all_reduce job (2 ranks per node), start to exit: settings, port, srun fan-out, raw logs
  pulled back through steps.

Wall time and head CPU (the command and its children) per run; the slopes over k are the
per-node costs that the 1024-node rows project, with the head's cores as the bound.

Run: .venv/bin/python bench/bench_slurm_only.py [--nodes 8] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_srun import JOB, ORCH, PROJECT_TO, REPO, TIMEOUT_S, Allocation, slope
from bench.common import (
    Budget,
    Sample,
    Summary,
    command_line,
    exit_cleanly_on_sigterm,
    machine,
    machine_line,
    now_utc,
    print_header,
    render_table,
    run_alternating,
    run_timed,
    summarize,
    write_results,
)
from orchestrator.sandbox.cluster import Sandbox
from orchestrator.specs.inventory import fold_nodeset

STEP_PROGRAM = """
import os, sys
from orchestrator.nodes.srun import run_on_nodes_via_srun
nodes = sys.argv[2].split(",")
command = "true" if sys.argv[1] == "step" else (lambda node: "true")
results = run_on_nodes_via_srun(nodes, command, slurm_job=os.environ["SLURM_JOB_ID"],
                                timeout=120)
sys.exit(0 if all(r.ok for r in results) else 1)
"""


class Runs:
    def __init__(self, allocation: Allocation, base: Path) -> None:
        self.alloc, self.base, self.count = allocation, base, 0

    def run(self, method: str) -> Sample:
        kind, k = method.split(":")
        nodes = self.alloc.nodes[: int(k)]
        include = ["--include", fold_nodeset(nodes)]
        runs = ["--runs-dir", str(self.base / "runs")]
        argv = {
            "step": [sys.executable, "-c", STEP_PROGRAM, "step", ",".join(nodes)],
            "steps": [sys.executable, "-c", STEP_PROGRAM, "steps", ",".join(nodes)],
            "doctor": [ORCH, "doctor", "--transport", "slurm", "--json", *include],
            "launch": [ORCH, "launch", "--transport", "slurm", "--launcher", "torchrun",
                       "--no-doctor", "-q", *include, *runs, str(JOB), "--", "--steps", "2"],
        }[kind]  # fmt: skip
        self.count += 1
        done = run_timed(argv, cwd=REPO, env=self.alloc.inside, timeout=TIMEOUT_S,
                         log=self.base / f"run-{self.count}.log")  # fmt: skip
        ok = done.code == 0
        if not ok:
            print(f"  FAILED {method}: exit {done.code}: {done.output[-500:]}", file=sys.stderr)
        return Sample(wall=done.wall, cpu=done.cpu, ok=ok)


def _good(samples: list[Sample]) -> list[Sample]:
    return [s for s in samples if s.ok]


def _ms(summary: Summary) -> str:
    return f"{summary.median * 1000:.0f} ({summary.low * 1000:.0f}-{summary.high * 1000:.0f})"


def measured_rows(samples: dict[str, list[Sample]], kinds: list[str],
                  sizes: list[int]) -> list[list[object]]:  # fmt: skip
    rows = []
    for kind in kinds:
        for k in sizes:
            good = _good(samples[f"{kind}:{k}"])
            rows.append([kind, k, _ms(summarize([s.wall for s in good])),
                         _ms(summarize([s.cpu for s in good])),
                         f"{len(good)}/{len(samples[f'{kind}:{k}'])}"])  # fmt: skip
    return rows


def per_node(samples: dict[str, list[Sample]], kind: str, sizes: list[int],
             field: str) -> tuple[float, float]:  # fmt: skip
    """(slope per node, cost at the smallest k) of `field` for `kind`."""
    points = [(k, summarize([getattr(s, field) for s in _good(samples[f"{kind}:{k}"])]).median)
              for k in sizes]  # fmt: skip
    return slope(points), points[0][1] - slope(points) * points[0][0]


def projection(samples: dict[str, list[Sample]], kinds: list[str], sizes: list[int],
               cores: int) -> tuple[list[list[object]], dict[str, float]]:  # fmt: skip
    """Head CPU: fixed part + per node x N (least squares over k). Wall: the smallest run's
    wall plus the head CPU of the nodes beyond it spread over the head's cores. On a real
    cluster each node runs its own side (the probe, the ranks) on its own cores, in
    parallel: here every node shares these 2 cores, so the wall measured at k nodes grows
    with k for that reason alone, and is not projected."""
    rows, inputs = [], {}
    smallest = sizes[0]
    for kind in kinds:
        cpu_slope, cpu_base = per_node(samples, kind, sizes, "cpu")
        wall_first = summarize([s.wall for s in _good(samples[f"{kind}:{smallest}"])]).median
        inputs.update({f"{kind}_cpu_per_node": cpu_slope, f"{kind}_cpu_fixed": cpu_base,
                       f"{kind}_wall_at_{smallest}": wall_first})  # fmt: skip
        for n in PROJECT_TO:
            cpu = cpu_base + cpu_slope * n
            wall = wall_first + max(0.0, cpu_slope) * (n - smallest) / cores
            rows.append([kind, n, f"{cpu:.1f}", f"{wall:.1f}", f"{cpu_slope * 1000:.1f}"])
    return rows, inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--budget", type=float, default=1800.0, help="seconds at most")
    args = parser.parse_args()
    exit_cleanly_on_sigterm()
    info = machine()
    print_header("orch on Slurm only (nodes refuse SSH)", info)
    sizes = [k for k in (2, 4, 8, 16, 32) if k <= args.nodes]
    kinds = ["step", "steps", "doctor", "launch"]
    methods = [f"{kind}:{k}" for kind in kinds for k in sizes]
    directory = Path(tempfile.mkdtemp(prefix="orch-bench-slurm-only-"))
    box = Sandbox(directory / "sandbox")
    state = box.up(nodes=args.nodes, slots=2, prefix="so", sshd_profile="no-ssh", slurm=True)
    allocation = Allocation(state, slots=2)
    allocation.inside["PYTHONPATH"] = str(REPO)  # this tree's orch, whatever is installed
    try:
        runs = Runs(allocation, directory)
        samples = run_alternating(methods, args.reps, Budget(args.budget), runs.run)
    finally:
        allocation.release()
        box.down()
    measured = measured_rows(samples, kinds, sizes)
    projected, inputs = projection(samples, kinds, sizes, os.cpu_count() or 2)
    print(render_table(["operation", "nodes", "wall ms", "head CPU ms", "ok runs"], measured))
    print(render_table(["operation", "nodes", "head CPU s", "wall s", "head CPU ms/node"],
                       projected))  # fmt: skip
    path = write_results("slurm-only", {
        "when": now_utc(), "command": command_line(), "machine": info,
        "machine_line": machine_line(info), "reps": args.reps, "sizes": sizes,
        "samples": samples, "measured": measured, "projected": projected, "inputs": inputs,
    })  # fmt: skip
    print(f"results: {path}")


if __name__ == "__main__":
    main()
