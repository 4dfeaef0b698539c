"""Helpers for the launch integration tests: run orch, look at nodes over plain ssh."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALLREDUCE = str(REPO / "tests" / "jobs" / "allreduce.py")
# The first-failure race (allreduce.py): five all_reduce steps of 20 ms, then a fault while
# the peers wait in one more all_reduce; a peer that loses it exits at once.
RACE = ("--steps", "5", "--step-sleep", "0.02", "--peers-exit-at-once")
ORCH = [str(Path(sys.executable).with_name("orch"))]


def orch_env(runs: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["ORCH_RUNS_DIR"] = str(runs)
    env.pop("ORCH_JOB_ID", None)
    # The defaults of the user running the tests are not the test's.
    env.pop("ORCH_HOSTFILE", None)
    env["XDG_CONFIG_HOME"] = f"{runs}.config"
    return env


def slurm_env(state, runs: Path) -> dict[str, str]:
    """orch_env for the sandbox's Slurm: its SLURM_CONF, and never the allocation of
    whatever runs the tests."""
    env = orch_env(runs)
    env["SLURM_CONF"] = state.slurm_conf
    for name in [n for n in env if n.startswith("SLURM_") and n != "SLURM_CONF"]:
        del env[name]
    return env


def run_orch(args: list[str], runs: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ORCH, *args], cwd=REPO, env=orch_env(runs), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def start_orch(args: list[str], runs: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [*ORCH, *args], cwd=REPO, env=orch_env(runs), stdout=out, stderr=subprocess.STDOUT
        )


def free_port() -> int:
    """A port nothing listens on now: sandbox nodes share this machine's network stack."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_args(
    hostfile: object, launcher: str, *script_args: str, nproc: int = 1, port: int | None = None
) -> list[str]:
    port = port or free_port()
    return [
        "launch", "--hostfile", str(hostfile), "--launcher", launcher,
        "--nproc-per-node", str(nproc), "--main-port", str(port), "--no-doctor",
        ALLREDUCE, "--", *script_args,
    ]  # fmt: skip


def job_ids(runs: Path) -> list[str]:
    if not runs.exists():
        return []
    return sorted(p.name for p in runs.iterdir() if (p / "job.json").exists())


def job_json(runs: Path, job_id: str) -> dict:
    return json.loads((runs / job_id / "job.json").read_text())


def job_processes(node: str, job_id: str) -> list[str]:
    """PIDs on `node` whose environment has ORCH_JOB_ID=<job_id>: read over plain ssh."""
    script = (
        "for f in /proc/[0-9]*/environ; do "
        f'tr "\\0" "\\n" < "$f" 2>/dev/null | grep -qx "ORCH_JOB_ID={job_id}" && echo "$f"; '
        "done; true"
    )
    result = subprocess.run(
        ["ssh", "-o", "BatchMode=yes", node, script],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [line for line in result.stdout.split() if line.startswith("/proc/")]


def wait_for(predicate: Callable[[], object], timeout: float, step: float = 0.1) -> bool:
    """Whether `predicate` holds within `timeout` seconds, asked every `step` seconds at
    first, then less often, up to every half second: the one way the tests wait for
    something to happen (never a fixed sleep). A wait of minutes (a job's end, a Slurm
    allocation) asks a few hundred times, not thousands: the suite is bound by the CPU."""
    deadline = time.monotonic() + timeout
    pause = step
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(pause)
        pause = min(pause * 1.25, max(step, 0.5))
    return bool(predicate())


def log_text(runs: Path, job_id: str, node: str) -> str:
    path = runs / job_id / "logs" / f"{node}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def log_stamp(line: str) -> float:
    """The time a line of a node's log (log_text) was written, in seconds since the epoch."""
    return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()


def all_ranks_up(runs: Path, job_id: str, nodes: list[str]) -> bool:
    return all(" up on " in log_text(runs, job_id, node) for node in nodes)
