"""Nodes that share one kernel and process table (two hostfile entries on one machine,
several slurmd on one host, containers sharing the host's PIDs): each node's end of the job
ends only that node's processes, and a job whose ranks all succeed succeeds."""

from __future__ import annotations

import pytest
from launch_support import REPO, free_port, job_ids, job_json, job_processes, run_orch

pytestmark = pytest.mark.sandbox

STAGGERED = str(REPO / "tests" / "jobs" / "staggered.py")


@pytest.fixture(scope="module")
def shared(sandbox_factory):
    return sandbox_factory(3, 2, shared_pids=True)


@pytest.mark.parametrize("launcher", ["pdsh", "torchrun", "standard"])
def test_the_first_node_to_finish_leaves_the_others_running(shared, tmp_path, launcher):
    _box, state = shared
    names = [node.name for node in state.nodes]
    result = run_orch(["launch", "--hostfile", state.hostfile, "--launcher", launcher,
                       "--main-port", str(free_port()), "--no-doctor", STAGGERED, "2"],
                      tmp_path, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for rank in range(6):
        assert f"result of rank {rank}: ok" in result.stdout
    [job_id] = job_ids(tmp_path)
    record = job_json(tmp_path, job_id)
    assert record["state"] == "succeeded"
    assert record["node_exit_codes"] == dict.fromkeys(names, 0)
    for node in names:
        assert job_processes(node, job_id) == []
