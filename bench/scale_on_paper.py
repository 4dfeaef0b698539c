"""Scale on paper: pre-flight and launch at 256 and 1024 nodes, projected from measured
per-node costs, with what limits them.

Measured here, on a private sandbox (default 16 nodes), in one run:
- pdsh fan-out as the launch uses it (every connection open at once, as a job holds
  them): head CPU per node (pdsh and its ssh clients), pdsh's file descriptors and
  threads per open connection, ssh client processes and their memory;
- orch's SSH (paramiko, `orchestrator.ssh`'s parallel runs, as doctor uses it):
  head CPU per node, file descriptors and threads at its parallelism limit.
Read from the latest bench/results files when present: `orch doctor`'s per-node head CPU
and the launch benchmark's wall times.

The projection is arithmetic on those figures (printed with the formula), for a
head with the same per-core speed; the limits are this machine's and the usual
defaults. Run: .venv/bin/python bench/scale_on_paper.py [--nodes 16] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    RESULTS_DIR,
    children_cpu,
    command_line,
    exit_cleanly_on_sigterm,
    machine,
    machine_line,
    now_utc,
    print_header,
    private_sandbox,
    render_table,
    summarize,
    write_results,
)

TARGETS = (256, 1024)
DEEPSPEED_PDSH_WINDOW = 1024  # deepspeed/launcher/constants.py PDSH_MAX_FAN_OUT
HOLD_S = 4.0  # how long each node's command keeps its connection open while we sample


@dataclass(frozen=True)
class Footprint:
    """Peak resources of the head-side fan-out while every connection is open."""

    fds: int
    threads: int
    ssh_processes: int
    ssh_rss_mib: float


def _count_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _threads(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return found


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _sample_peak(pid: int, stop: Callable[[], bool]) -> Footprint:
    peak = Footprint(0, 0, 0, 0.0)
    while not stop():
        kids = _children(pid)
        now = Footprint(
            fds=_count_fds(pid),
            threads=_threads(pid),
            ssh_processes=len(kids),
            ssh_rss_mib=sum(_rss_mib(k) for k in kids),
        )
        if now.fds + now.threads >= peak.fds + peak.threads:
            peak = now
        time.sleep(0.1)
    return peak


def pdsh_footprint(names: list[str]) -> Footprint:
    """pdsh with every connection open at once (window = nodes), as during a job."""
    argv = ["pdsh", "-R", "ssh", "-f", str(len(names)), "-w", ",".join(names), f"sleep {HOLD_S}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(HOLD_S / 2)  # let every connection come up
    peak = _sample_peak(proc.pid, lambda: proc.poll() is not None)
    proc.wait(timeout=120)
    return peak


def pdsh_cost(names: list[str], reps: int) -> tuple[list[float], list[float]]:
    """Wall and head CPU (pdsh + ssh clients) of `pdsh -w all true`."""
    walls, cpus = [], []
    for _ in range(reps):
        cpu0, t0 = children_cpu(), time.perf_counter()
        subprocess.run(
            ["pdsh", "-R", "ssh", "-f", str(len(names)), "-w", ",".join(names), "true"],
            capture_output=True, timeout=300, check=True,
        )  # fmt: skip
        walls.append(time.perf_counter() - t0)
        cpus.append(children_cpu() - cpu0)
    return walls, cpus


def paramiko_cost(names: list[str], reps: int) -> tuple[list[float], list[float], Footprint]:
    """Wall and in-process CPU of orch's run_on_nodes over every node, and its footprint."""
    from orchestrator.ssh import run_on_nodes

    walls, cpus = [], []
    for _ in range(reps):
        usage0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        outcomes = run_on_nodes(names, "true", timeout=60)
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        walls.append(time.perf_counter() - t0)
        cpus.append(usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime)
        failed = [o.node for o in outcomes.failed]
        if failed:
            raise RuntimeError(f"run_on_nodes failed on {failed}")
    done = threading.Event()
    pid = os.getpid()
    base_fds, base_threads = _count_fds(pid), _threads(pid)
    holder: list[Footprint] = []
    sampler = threading.Thread(
        target=lambda: holder.append(_sample_peak(pid, done.is_set)), daemon=True
    )
    sampler.start()
    run_on_nodes(names, f"sleep {HOLD_S}", timeout=60)
    done.set()
    sampler.join()
    peak = holder[0]
    # Count what the fan-out added, not the interpreter's own descriptors and threads.
    footprint = Footprint(
        fds=peak.fds - base_fds, threads=peak.threads - base_threads - 1,
        ssh_processes=0, ssh_rss_mib=0.0,
    )  # fmt: skip
    return walls, cpus, footprint


def latest_result(name: str) -> Mapping[str, object] | None:
    # Names are <benchmark>-<UTC time>.json: the time starts with the year's digit.
    files = sorted(RESULTS_DIR.glob(f"{name}-[0-9]*.json"))
    if not files:
        return None
    return json.loads(files[-1].read_text())


def doctor_cpu_per_node(preflight: Mapping[str, object] | None) -> tuple[float, int] | None:
    """(head CPU s per node, at how many nodes) of `orch doctor` from the pre-flight
    benchmark (bench_preflight.py), at its largest size."""
    if not preflight:
        return None
    by_size = preflight.get("results") or {}
    measured = {
        int(n): [s for s in methods.get("orch-doctor", []) if s.get("ok")]  # type: ignore[union-attr]
        for n, methods in by_size.items()  # type: ignore[union-attr]
    }
    measured = {n: samples for n, samples in measured.items() if samples}
    if not measured:
        return None
    nodes = max(measured)
    return statistics.median(s["cpu"] / nodes for s in measured[nodes]), nodes


def limits() -> dict[str, object]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    threads_max = Path("/proc/sys/kernel/threads-max").read_text().strip()
    ports = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return {
        "nofile_soft": soft, "nofile_hard": hard, "nproc_soft": nproc[0],
        "threads_max": int(threads_max), "ephemeral_ports": int(ports[1]) - int(ports[0]) + 1,
    }  # fmt: skip


def per_conn(total: float, nodes: int) -> float:
    return total / nodes if nodes else 0.0


def project(
    nodes: int,
    pdsh: Mapping[str, float],
    ssh: Mapping[str, float],
    doctor_cpu: float | None,
    cores: int,
    parallel: int,
) -> dict[str, object]:
    """Projected figures at `nodes` (arithmetic, see the module docstring)."""
    # On a real cluster the sshd side runs on the nodes, so the head pays only its own
    # CPU (spread over its cores) and, per wave of parallel connections, one round trip.
    waves = math.ceil(nodes / parallel)
    doctor_per_node = doctor_cpu if doctor_cpu is not None else ssh["cpu_per_node"]
    preflight_cpu = nodes * doctor_per_node
    preflight_wall = max(waves * ssh["wall_one"], preflight_cpu / cores)
    fanout_cpu = nodes * pdsh["cpu_per_node"]
    return {
        "nodes": nodes,
        "preflight_head_cpu_s": preflight_cpu,
        "preflight_wall_s": preflight_wall,
        "preflight_waves": waves,
        "serial_ssh_loop_s": nodes * pdsh["wall_one"],
        "deepspeed_check_s": pdsh["wall_one"],
        "fanout_head_cpu_s": fanout_cpu,
        "fanout_wall_s": max(pdsh["wall_one"], fanout_cpu / cores),
        "pdsh_fds": round(pdsh["fds_per_conn"] * nodes + pdsh["fds_base"]),
        "pdsh_threads": round(pdsh["threads_per_conn"] * nodes + 1),
        "ssh_clients": nodes,
        "ssh_client_mem_gib": nodes * pdsh["rss_per_ssh_mib"] / 1024,
        "orch_ssh_fds": round(ssh["fds_per_conn"] * min(nodes, parallel)),
        "orch_ssh_threads": round(ssh["threads_per_conn"] * min(nodes, parallel)),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16, help="sandbox size to measure on")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=64, help="orch's SSH parallelism")
    parser.add_argument("--quick", action="store_true", help="8 nodes, 1 repetition")
    return parser.parse_args()


def measure(count: int, reps: int) -> tuple[dict[str, float], dict[str, float]]:
    with private_sandbox(count, 1, tag="sp") as state:
        names = [n.name for n in state.nodes]
        one_walls, _ = pdsh_cost(names[:1], reps)
        walls, cpus = pdsh_cost(names, reps)
        foot = pdsh_footprint(names)
        base_fds = 3
        pdsh = {
            "wall": summarize(walls).median,
            "wall_one": summarize(one_walls).median,
            "cpu_per_node": summarize(cpus).median / count,
            "fds_per_conn": per_conn(foot.fds - base_fds, count),
            "fds_base": base_fds,
            "threads_per_conn": per_conn(foot.threads - 1, count),
            "rss_per_ssh_mib": per_conn(foot.ssh_rss_mib, max(1, foot.ssh_processes)),
            "ssh_processes": foot.ssh_processes,
        }
        swalls, scpus, sfoot = paramiko_cost(names, reps)
        one_walls, _one_cpus, _ = paramiko_cost(names[:1], reps)
        ssh = {
            "wall": summarize(swalls).median,
            "wall_one": summarize(one_walls).median,
            "cpu_per_node": summarize(scpus).median / count,
            "fds_per_conn": per_conn(sfoot.fds, count),
            "threads_per_conn": per_conn(sfoot.threads, count),
        }
    return pdsh, ssh


def main() -> None:
    exit_cleanly_on_sigterm()
    args = parse_args()
    count = 8 if args.quick else args.nodes
    reps = 1 if args.quick else args.reps
    info = machine()
    print_header("scale on paper", info)
    pdsh, ssh = measure(count, reps)
    doctor = doctor_cpu_per_node(latest_result("preflight"))
    cores = int(info["cpus"] or 1)  # type: ignore[arg-type]
    lim = limits()
    measured = render_table(
        ["measured on", "per-node head CPU s", "wall s (all nodes)", "fds per open conn",
         "threads per open conn", "other"],
        [
            [f"pdsh -f {count}, {count} nodes", f"{pdsh['cpu_per_node']:.3f}",
             f"{pdsh['wall']:.2f}", f"{pdsh['fds_per_conn']:.1f}",
             f"{pdsh['threads_per_conn']:.1f}",
             f"{pdsh['ssh_processes']:.0f} ssh clients, {pdsh['rss_per_ssh_mib']:.1f} MiB each"],
            [f"orch SSH (paramiko), {count} nodes", f"{ssh['cpu_per_node']:.3f}",
             f"{ssh['wall']:.2f}", f"{ssh['fds_per_conn']:.1f}",
             f"{ssh['threads_per_conn']:.1f}", "in-process, no child processes"],
            ["orch doctor (bench_preflight)",
             "n/a" if doctor is None else f"{doctor[0]:.3f} (at {doctor[1]} nodes)",
             "", "", "", "probe + checks, from the latest pre-flight results"],
        ],
    )  # fmt: skip
    projections = [
        project(n, pdsh, ssh, doctor[0] if doctor else None, cores, args.parallel) for n in TARGETS
    ]
    projected = render_table(
        ["nodes", "pre-flight wall s (head CPU s)", "serial ssh loop s", "DeepSpeed check s",
         "fan-out wall s (head CPU s)", "pdsh fds / threads", "ssh clients (memory)",
         "orch SSH fds / threads"],
        [
            [p["nodes"], f"{p['preflight_wall_s']:.0f} ({p['preflight_head_cpu_s']:.0f})",
             f"{p['serial_ssh_loop_s']:.0f}", f"{p['deepspeed_check_s']:.1f} (first host only)",
             f"{p['fanout_wall_s']:.0f} ({p['fanout_head_cpu_s']:.0f})",
             f"{p['pdsh_fds']} / {p['pdsh_threads']}",
             f"{p['ssh_clients']} ({p['ssh_client_mem_gib']:.1f} GiB)",
             f"{p['orch_ssh_fds']} / {p['orch_ssh_threads']}"]
            for p in projections
        ],
    )  # fmt: skip
    print("## measured\n" + measured)
    print(f"## projected ({cores} cores at this speed; orch SSH parallelism {args.parallel})")
    print(projected)
    print(f"limits here: {lim}")
    path = write_results(
        "scale",
        {
            "benchmark": "scale_on_paper",
            "date": now_utc(),
            "command": command_line(),
            "machine": info,
            "machine_line": machine_line(info),
            "measured_nodes": count,
            "pdsh": pdsh,
            "orch_ssh": ssh,
            "doctor_cpu_per_node": doctor,
            "parallel": args.parallel,
            "deepspeed_pdsh_window": DEEPSPEED_PDSH_WINDOW,
            "limits": lim,
            "projections": projections,
            "tables": {"measured": measured, "projected": projected},
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
