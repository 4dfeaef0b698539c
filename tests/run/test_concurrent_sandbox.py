"""Two jobs on the same 3 sandbox nodes at once, no port given: each gets its own main port
from node 0, both run, and stopping one leaves the other running."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from launch_support import REPO, job_ids, job_processes, log_text, start_orch, wait_for

from orchestrator.specs.constants import CHOSEN_PORT_RANGE

pytestmark = pytest.mark.sandbox

STEPPING = str(REPO / "tests" / "jobs" / "stepping.py")


@pytest.fixture(scope="module")
def cluster(sandbox_factory):
    return sandbox_factory(2, 1)


class _Job:
    def __init__(self, head: subprocess.Popen[bytes], runs: Path, out: Path, stop: Path) -> None:
        self.head, self.runs, self.out, self.stop = head, runs, out, stop

    @property
    def job_id(self) -> str:
        ids = job_ids(self.runs)
        return ids[0] if ids else ""

    def up(self, nodes: list[str]) -> bool:
        return bool(self.job_id) and all(
            " up on " in log_text(self.runs, self.job_id, node) for node in nodes
        )

    def record(self) -> dict:
        return json.loads((self.runs / self.job_id / "job.json").read_text())

    def has_port(self) -> bool:
        """Its record names the main port it picked (the second job starts after that)."""
        return bool(self.job_id) and bool(self.record().get("main_port"))


@pytest.fixture
def start_job(cluster, tmp_path: Path) -> Iterator:
    _box, state = cluster
    started: list[_Job] = []

    def start(name: str, launcher: str, *options: str) -> _Job:
        runs, stop = tmp_path / name / "runs", tmp_path / name / "stop"
        runs.mkdir(parents=True)
        args = [
            "launch", "--hostfile", state.hostfile, "--launcher", launcher,
            "--nproc-per-node", "1", *options, STEPPING, "--", "--pause", "0.2",
            "--stop-file", str(stop), "--max-seconds", "240",
        ]  # fmt: skip
        job = _Job(start_orch(args, runs, tmp_path / name / "out"), runs, tmp_path / name / "out",
                   stop)  # fmt: skip
        started.append(job)
        return job

    yield start, [node.name for node in state.nodes]
    for job in started:
        if job.head.poll() is None:
            job.head.send_signal(signal.SIGINT)
            try:
                job.head.wait(60)
            except subprocess.TimeoutExpired:
                job.head.kill()


def _both_up(first: _Job, second: _Job, nodes: list[str]) -> None:
    for job in (first, second):
        assert wait_for(lambda job=job: job.up(nodes), 180), job.out.read_text()
    ports = {job.record()["main_port"] for job in (first, second)}
    assert len(ports) == 2, "both jobs got the same main port"
    low, high = CHOSEN_PORT_RANGE
    assert all(low <= port <= high for port in ports)
    assert all(job.record()["main_port_chosen"] for job in (first, second))


def test_two_jobs_without_ports_run_side_by_side_and_ctrl_c_stops_only_one(start_job):
    start, nodes = start_job
    first = start("a", "torchrun", "--no-doctor")
    assert wait_for(first.has_port, 120), first.out.read_text()
    second = start("b", "torchrun", "--no-doctor")
    _both_up(first, second, nodes)

    second.head.send_signal(signal.SIGINT)
    assert second.head.wait(60) == 130, second.out.read_text()
    for node in nodes:
        assert job_processes(node, second.job_id) == [], f"job b left on {node}"
        assert job_processes(node, first.job_id), f"job a was stopped on {node} too"
    first.stop.touch()
    assert first.head.wait(120) == 0, first.out.read_text()
    assert first.record()["state"] == "succeeded"


def test_two_jobs_with_the_preflight_both_succeed(start_job):
    start, nodes = start_job
    first = start("a", "standard")
    assert wait_for(first.has_port, 180), first.out.read_text()
    second = start("b", "torchrun")
    _both_up(first, second, nodes)
    for job in (first, second):
        job.stop.touch()
    for job in (first, second):
        assert job.head.wait(120) == 0, job.out.read_text()
