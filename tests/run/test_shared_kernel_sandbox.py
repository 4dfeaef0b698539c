"""Nodes that share one kernel and process table (two hostfile entries on one machine,
several slurmd on one host, containers sharing the host's PIDs): each node's end of the job
ends only that node's processes, and a job whose ranks all succeed succeeds."""

from __future__ import annotations

import json
import signal

import pytest
from launch_support import (
    REPO,
    free_port,
    job_ids,
    job_json,
    job_processes,
    log_text,
    run_orch,
    start_orch,
    wait_for,
)

pytestmark = pytest.mark.sandbox

STAGGERED = str(REPO / "tests" / "jobs" / "staggered.py")


@pytest.fixture(scope="module")
def shared(sandbox_factory):
    return sandbox_factory(2, 2, shared_pids=True)


@pytest.mark.parametrize("launcher", ["pdsh", "torchrun", "standard"])
def test_the_first_node_to_finish_leaves_the_others_running(shared, tmp_path, launcher):
    _box, state = shared
    names = [node.name for node in state.nodes]
    result = run_orch(["launch", "--hostfile", state.hostfile, "--launcher", launcher,
                       "--main-port", str(free_port()), "--no-doctor", STAGGERED, "2"],
                      tmp_path, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for rank in range(4):
        assert f"result of rank {rank}: ok" in result.stdout
    [job_id] = job_ids(tmp_path)
    record = job_json(tmp_path, job_id)
    assert record["state"] == "succeeded"
    assert record["node_exit_codes"] == dict.fromkeys(names, 0)
    for node in names:
        assert job_processes(node, job_id) == []


STEPPING = str(REPO / "tests" / "jobs" / "stepping.py")


def test_stacks_and_kill_address_each_node_alone(shared, tmp_path):
    _box, state = shared
    names = [node.name for node in state.nodes]
    args = ["launch", "--hostfile", state.hostfile, "--launcher", "torchrun",
            "--main-port", str(free_port()), "--no-doctor", STEPPING, "--", "--compute", "0",
            "--lead-pause", "0.05", "--max-seconds", "240"]  # fmt: skip
    head = start_orch(args, tmp_path, tmp_path / "launch.out")
    try:
        assert wait_for(lambda: job_ids(tmp_path), 60), (tmp_path / "launch.out").read_text()
        [job_id] = job_ids(tmp_path)
        up = lambda: sum(log_text(tmp_path, job_id, n).count(" up on ") for n in names)  # noqa: E731
        assert wait_for(lambda: up() == 4, 180), (tmp_path / "launch.out").read_text()

        stacks = run_orch(["stacks", job_id, "--json"], tmp_path, timeout=120)
        assert stacks.returncode == 0, stacks.stderr
        doc = json.loads(stacks.stdout)
        # Each node answers for its own two ranks, though all four are in every node's /proc.
        per_node = {node["node"]: sorted(r["rank"] for r in node["ranks"]) for node in doc["nodes"]}
        assert per_node == {name: [2 * i, 2 * i + 1] for i, name in enumerate(names)}, per_node

        killed = run_orch(["kill", job_id], tmp_path, timeout=120)
        assert killed.returncode == 0, killed.stderr
        assert head.wait(120) == 128 + signal.SIGTERM
        for node in names:
            assert job_processes(node, job_id) == [], f"job left running on {node}"
    finally:
        if head.poll() is None:
            head.send_signal(signal.SIGINT)
            head.wait(60)
