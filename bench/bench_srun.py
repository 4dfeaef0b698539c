"""Benchmark: srun against pdsh as orch's fan-out, on the same sandbox nodes under a real
Slurm, and what each costs per node, for a projection to 1024 nodes.

One sandbox with Slurm (`orch sandbox up --slurm`), one allocation of every node held for
the whole run (`salloc --no-shell`); everything below runs inside it, alternating:

- fan-out alone, on k = 1, 2, 4 ... N nodes: `pdsh -w <k nodes> true` (orch's pdsh
  options) against `srun --jobid J -N k --ntasks-per-node=1 true`: wall time, head CPU
  (the command and its children) and slurmctld's CPU (on a real cluster it runs on a
  machine of its own). The slopes over k are the per-node costs.
- a whole job: `orch launch --fanout pdsh|srun --launcher torchrun --no-doctor` of a small
  gloo all_reduce job (2 ranks per node on the allocation's nodes), start to exit.

The projection (scale rows) is a model with the measured inputs: pdsh from one head pays
its per-node head CPU for every node (ssh's key exchange and session), spread over the
head's cores; srun sends to TreeWidth nodes and each slurmd forwards to its own subtree
(Slurm's tree fan-out), so its launch depth grows as ceil(log_TreeWidth(N)) while the
head keeps one I/O connection per task.

Run: .venv/bin/python bench/bench_srun.py [--nodes 8] [--reps 3] [--job-nodes 4]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    Budget,
    Sample,
    Summary,
    command_line,
    exit_cleanly_on_sigterm,
    head_env,
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
from orchestrator.plan.pdsh_command import build_pdsh_argv, pdsh_environment
from orchestrator.sandbox.state import SandboxState
from orchestrator.specs.inventory import fold_nodeset

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "jobs" / "allreduce.py"
ORCH = str(Path(sys.executable).with_name("orch"))
TIMEOUT_S = 300.0
PROJECT_TO = (256, 1024)


def _ticks(pid: int) -> float:
    """CPU seconds a process has used (utime + stime from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _slurmctld_pid(state: SandboxState) -> int:
    return state.slurm_pids[1]


class Allocation:
    """Every node of the sandbox, held with `salloc --no-shell` for the whole run."""

    def __init__(self, state: SandboxState, slots: int) -> None:
        self.env = head_env({"SLURM_CONF": state.slurm_conf})
        for name in [n for n in self.env if n.startswith("SLURM_") and n != "SLURM_CONF"]:
            del self.env[name]
        done = subprocess.run(
            ["salloc", "--no-shell", f"-N{len(state.nodes)}", f"--ntasks-per-node={slots}"],
            env=self.env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        found = re.search(r"Granted job allocation (\d+)", done.stderr)
        if found is None:
            raise SystemExit(f"salloc gave no allocation: {done.stderr}")
        self.job = found.group(1)
        self.nodes = [n.name for n in state.nodes]
        self.inside = {
            **self.env, "SLURM_JOB_ID": self.job, "SLURM_JOB_NODELIST": fold_nodeset(self.nodes),
            "SLURM_TASKS_PER_NODE": f"{slots}(x{len(self.nodes)})",
        }  # fmt: skip

    def release(self) -> None:
        subprocess.run(["scancel", self.job], env=self.env, timeout=30, check=False)


class Runs:
    def __init__(self, state: SandboxState, allocation: Allocation, base: Path) -> None:
        self.state = state
        self.alloc = allocation
        self.base = base
        self.count = 0

    def _timed(self, argv: list[str], env: dict[str, str], expect: str = "") -> Sample:
        self.count += 1
        ctld = _slurmctld_pid(self.state)
        before = _ticks(ctld)
        done = run_timed(argv, cwd=REPO, env=env, timeout=TIMEOUT_S,
                         log=self.base / f"run-{self.count}.log")  # fmt: skip
        ok = done.code == 0 and expect in done.output
        if not ok:
            print(f"  FAILED: exit {done.code}: {done.output[-500:]}", file=sys.stderr)
        return Sample(wall=done.wall, cpu=done.cpu, ok=ok,
                      extra={"slurmctld_cpu": _ticks(ctld) - before})  # fmt: skip

    def fanout(self, method: str) -> Sample:
        kind, k = method.split(":")
        nodes = self.alloc.nodes[: int(k)]
        if kind == "pdsh":
            argv = build_pdsh_argv(nodes, "true", window=max(64, len(nodes)))
            return self._timed(argv, pdsh_environment(self.alloc.env))
        argv = ["srun", f"--jobid={self.alloc.job}", f"-N{k}", f"-n{k}", "--ntasks-per-node=1",
                f"--nodelist={fold_nodeset(nodes)}", "true"]  # fmt: skip
        return self._timed(argv, self.alloc.env)

    def job(self, method: str) -> Sample:
        fanout = method.split(":")[1]
        argv = [ORCH, "launch", "--slurm", "--fanout", fanout, "--launcher", "torchrun",
                "--no-doctor", "-q", "--runs-dir", str(self.base / "runs"), str(JOB), "--",
                "--steps", "2"]  # fmt: skip
        return self._timed(argv, self.alloc.inside, expect="succeeded")


def fanout_rows(samples: dict[str, list[Sample]], sizes: list[int]) -> list[list[object]]:
    rows = []
    for k in sizes:
        pdsh = [s for s in samples[f"pdsh:{k}"] if s.ok]
        srun = [s for s in samples[f"srun:{k}"] if s.ok]
        for name, good in (("pdsh", pdsh), ("srun", srun)):
            wall = summarize([s.wall for s in good])
            cpu = summarize([s.cpu for s in good])
            ctld = summarize([float(s.extra["slurmctld_cpu"]) for s in good])
            base = summarize([s.wall for s in pdsh]).median
            rows.append([k, name, _ms(wall), _ms(cpu), _ms(ctld),
                         ratio_text(ratio(wall.median, base)), f"{len(good)}"])  # fmt: skip
    return rows


def _ms(summary: Summary) -> str:
    """Milliseconds, median (min-max): a fan-out of `true` takes tens of them."""
    return f"{summary.median * 1000:.0f} ({summary.low * 1000:.0f}-{summary.high * 1000:.0f})"


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in points)
    den = sum((x - mean_x) ** 2 for x, _ in points) or 1.0
    return num / den


def per_node(samples: dict[str, list[Sample]], kind: str, sizes: list[int], field: str
             ) -> tuple[float, float]:  # fmt: skip
    """(per-node cost, cost at one node) of `field` (wall or cpu) for `kind`."""
    points = [(k, summarize([getattr(s, field) for s in samples[f"{kind}:{k}"] if s.ok]).median)
              for k in sizes]  # fmt: skip
    return slope(points), points[0][1]


def tree_width(env: dict[str, str]) -> int:
    done = subprocess.run(["scontrol", "show", "config"], env=env, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    found = re.search(r"^TreeWidth\s*=\s*(\d+)", done.stdout, re.M)
    return int(found.group(1)) if found else 50


def projection(samples: dict[str, list[Sample]], sizes: list[int], width: int,
               cores: int) -> tuple[list[list[object]], dict[str, float]]:  # fmt: skip
    pdsh_cpu, _ = per_node(samples, "pdsh", sizes, "cpu")
    pdsh_wall, pdsh_base = per_node(samples, "pdsh", sizes, "wall")
    srun_cpu, srun_cpu_base = per_node(samples, "srun", sizes, "cpu")
    srun_wall, srun_base = per_node(samples, "srun", sizes, "wall")
    inputs = {"pdsh_cpu_per_node": pdsh_cpu, "pdsh_wall_per_node": pdsh_wall,
              "pdsh_wall_1": pdsh_base, "srun_cpu_per_node": srun_cpu,
              "srun_cpu_1": srun_cpu_base, "srun_wall_per_node": srun_wall,
              "srun_wall_1": srun_base, "tree_width": width, "head_cores": cores}  # fmt: skip
    rows = []
    for n in PROJECT_TO:
        # pdsh: every node's ssh costs the head its CPU; the head's cores bound the rate (the
        # nodes' own side runs in parallel on a real cluster, not on these shared cores).
        pdsh_head = pdsh_cpu * n
        pdsh_t = pdsh_base + pdsh_head / cores
        # srun: the head sends to at most TreeWidth nodes per level; each further level is
        # one more hop of the same per-message cost; the head still serves every task's I/O.
        depth = max(1, math.ceil(math.log(n, width)))
        srun_t = srun_base + depth * srun_wall * min(n, width)
        srun_head = srun_cpu_base + srun_cpu * n
        rows.append([n, f"{pdsh_t:.1f}", f"{pdsh_head:.1f}", f"{srun_t:.1f}", f"{srun_head:.1f}",
                     depth, ratio_text(ratio(srun_t, pdsh_t))])  # fmt: skip
    return rows, inputs


def job_rows(samples: dict[str, list[Sample]]) -> list[list[object]]:
    base = summarize([s.wall for s in samples["job:pdsh"] if s.ok]).median
    base_cpu = summarize([s.cpu for s in samples["job:pdsh"] if s.ok]).median
    rows = []
    for method in ("job:pdsh", "job:srun"):
        good = [s for s in samples[method] if s.ok]
        wall, cpu = summarize([s.wall for s in good]), summarize([s.cpu for s in good])
        rows.append([method.split(":")[1], wall.text(), cpu.text(),
                     ratio_text(ratio(wall.median, base)), ratio_text(ratio(cpu.median, base_cpu)),
                     f"{len(good)}/{len(samples[method])}"])  # fmt: skip
    return rows


def main() -> None:
    exit_cleanly_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8, help="sandbox nodes (the largest k)")
    parser.add_argument("--job-nodes", type=int, default=4, help="nodes of the whole-job rows")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cap", type=float, default=3600.0)
    args = parser.parse_args()
    info = machine()
    print_header("fan-out: srun against pdsh under a real Slurm", info)
    sizes = sorted({1, *(2**i for i in range(1, 8) if 2**i < args.nodes), args.nodes})
    budget = Budget(args.cap)
    with private_sandbox(args.nodes, 2, tag="bs", slurm=True) as state:
        base = Path(tempfile.mkdtemp(prefix="orch-bench-srun-"))
        alloc = Allocation(state, 2)
        try:
            runs = Runs(state, alloc, base)
            methods = [f"{kind}:{k}" for k in sizes for kind in ("pdsh", "srun")]
            fan = run_alternating(methods, args.reps, budget, runs.fanout, label="fan-out ")
            alloc.inside["SLURM_JOB_NODELIST"] = fold_nodeset(alloc.nodes[: args.job_nodes])
            alloc.inside["SLURM_TASKS_PER_NODE"] = f"2(x{args.job_nodes})"
            jobs = run_alternating(["job:pdsh", "job:srun"], args.reps, budget, runs.job,
                                   label="job ")  # fmt: skip
            width = tree_width(alloc.env)
        finally:
            alloc.release()
    headers = ["nodes", "fan-out", "wall ms", "head CPU ms", "slurmctld CPU ms", "wall / pdsh",
               "ok runs"]  # fmt: skip
    fan_table = render_table(headers, fanout_rows(fan, sizes))
    job_table = render_table(
        ["fan-out", "wall s", "head CPU s", "wall / pdsh", "head CPU / pdsh", "ok runs"],
        job_rows(jobs),
    )
    rows, inputs = projection(fan, sizes, width, int(info.get("cpus") or os.cpu_count() or 1))
    scale_table = render_table(
        ["nodes", "pdsh wall s", "pdsh head CPU s", "srun wall s", "srun head CPU s",
         "srun tree depth", "srun / pdsh wall"], rows,
    )  # fmt: skip
    print(fan_table, job_table, scale_table, sep="\n\n")
    print("inputs:", {k: round(v, 4) for k, v in inputs.items()})
    path = write_results("srun", {
        "benchmark": "srun", "date": now_utc(), "command": command_line(), "machine": info,
        "machine_line": machine_line(info), "reps": args.reps, "sizes": sizes,
        "job_nodes": args.job_nodes, "fanout": fan, "jobs": jobs, "inputs": inputs,
        "tables": {"fanout": fan_table, "job": job_table, "scale": scale_table},
    })  # fmt: skip
    print(f"results: {path}")


if __name__ == "__main__":
    main()
