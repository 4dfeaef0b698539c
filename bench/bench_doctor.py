"""Benchmark: `orch doctor` against a serial `ssh node python -c <probe>` loop.

For each cluster size it brings up its own sandbox (private directory and name
prefix, taken down after), then alternates the two methods several times:

- doctor: a fresh process running doctor's pre-flight (`run_preflight`: parallel
  SSH, the probe, the main-port test), as `orch doctor` does after its start-up;
  the CLI's own start-up time is measured once and reported apart;
- serial: for each node in turn, `ssh node <the same probe command>` (what a
  shell loop over the hostfile does; it gathers the same facts, no port test).

It reports median and spread of the wall time, the ratio serial/doctor, and the
head's CPU seconds per node (getrusage of the children, which both methods are).
Run: .venv/bin/python bench/bench_doctor.py [--sizes 1,4,16,32] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.probe import probe_command  # noqa: E402
from orchestrator.sandbox import Sandbox  # noqa: E402

ORCH = str(ROOT / ".venv" / "bin" / "orch")
PYTHON = sys.executable


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


DOCTOR = """
import sys
from orchestrator.inventory import read_hostfile
from orchestrator.preflight import run_preflight
hostfile, python, workdir, port = sys.argv[1:5]
report = run_preflight(read_hostfile(hostfile), python=python, workdir=workdir, script=None,
                       main_port=int(port), timeout=60)
print("ok" if report.ok else "; ".join(f.problem for f in report.findings))
"""


def run_doctor(hostfile: str, port: int) -> tuple[float, float, bool]:
    cpu0, t0 = _children_cpu(), time.perf_counter()
    done = subprocess.run(
        [PYTHON, "-c", DOCTOR, hostfile, PYTHON, str(ROOT), str(port)],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )  # fmt: skip
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    ok = done.returncode == 0 and done.stdout.strip() == "ok"
    if not ok:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
    return wall, cpu, ok


def cli_startup() -> float:
    t0 = time.perf_counter()
    subprocess.run([ORCH, "--help"], capture_output=True, timeout=600, check=True)
    return time.perf_counter() - t0


def run_serial(names: list[str]) -> tuple[float, float, bool]:
    cpu0, t0 = _children_cpu(), time.perf_counter()
    ok = True
    for name in names:
        command = probe_command(PYTHON, workdir=str(ROOT), script=None, names=names)
        done = subprocess.run(
            ["ssh", "-o", "BatchMode=yes", name, command],
            capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        ok = ok and done.returncode == 0 and b"probe_version" in done.stdout
    return time.perf_counter() - t0, _children_cpu() - cpu0, ok


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def bench_size(nodes: int, reps: int, base: Path) -> dict[str, object]:
    tag = uuid.uuid4().hex[:5]
    box = Sandbox(base / f"bench-{nodes}-{tag}")
    state = box.up(nodes=nodes, slots=1, prefix=f"b{tag}n")
    names = [n.name for n in state.nodes]
    port = 31000 + nodes
    doctor_wall, doctor_cpu, serial_wall, serial_cpu = [], [], [], []
    try:
        run_doctor(state.hostfile, port)  # warm caches once, not counted
        for _ in range(reps):
            wall, cpu, ok = run_doctor(state.hostfile, port)
            assert ok, f"doctor failed on {nodes} nodes"
            doctor_wall.append(wall)
            doctor_cpu.append(cpu / nodes)
            wall, cpu, ok = run_serial(names)
            assert ok, f"serial ssh loop failed on {nodes} nodes"
            serial_wall.append(wall)
            serial_cpu.append(cpu / nodes)
    finally:
        box.down()
    return {
        "nodes": nodes,
        "reps": reps,
        "doctor_wall_s": _summary(doctor_wall),
        "serial_wall_s": _summary(serial_wall),
        "ratio": statistics.median(serial_wall) / statistics.median(doctor_wall),
        "doctor_cpu_s_per_node": statistics.median(doctor_cpu),
        "serial_cpu_s_per_node": statistics.median(serial_cpu),
        "raw": {"doctor": doctor_wall, "serial": serial_wall},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16,32")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    # SIGTERM unwinds like Ctrl-C, so every sandbox is taken down.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    load_before = os.getloadavg()
    startup = cli_startup()
    results = []
    with tempfile.TemporaryDirectory(prefix="orch-bench-doctor-") as tmp:
        for nodes in sizes:
            results.append(bench_size(nodes, args.reps, Path(tmp)))
            row = results[-1]
            print(f"{nodes} nodes done: doctor {row['doctor_wall_s']['median']:.2f}s, "
                  f"serial {row['serial_wall_s']['median']:.2f}s", flush=True)  # fmt: skip
    header = (
        f"{'nodes':>5} | {'doctor s (min-max)':>20} | {'serial ssh s (min-max)':>22} | "
        f"{'ratio':>5} | {'doctor cpu/node':>15} | {'serial cpu/node':>15}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        d, s = r["doctor_wall_s"], r["serial_wall_s"]
        print(
            f"{r['nodes']:>5} | {d['median']:6.2f} ({d['min']:.2f}-{d['max']:.2f})     | "
            f"{s['median']:6.2f} ({s['min']:.2f}-{s['max']:.2f})       | {r['ratio']:5.2f} | "
            f"{r['doctor_cpu_s_per_node']:13.3f} s | {r['serial_cpu_s_per_node']:13.3f} s"
        )
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    doc = {
        "benchmark": "doctor",
        "when": stamp,
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cli_startup_s": startup,
        "results": results,
    }
    out = out_dir / f"doctor-{stamp}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"`orch --help` start-up: {startup:.2f}s; load {load_before} -> {os.getloadavg()}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
