"""The first failure, exactly, on a real sandbox of 2 nodes x 2 ranks and every launcher: the
last rank ends with its own code while its peers, on its node and the other, are inside an
all_reduce and fail milliseconds later with gloo's lost-peer error. The job exits with the
failing rank's own code and names it, every time; its peers are listed as consequences.

ORCH_FIRST_FAILURE_RUNS sets how many jobs each launcher runs (1 here: the race is
timing-bound, and a second run proved little more at the CPU of 2 more jobs per launcher;
bench/bench_first_failure.py counts it over 20)."""

from __future__ import annotations

import os

import pytest
from launch_support import RACE, job_ids, job_json, job_processes, launch_args, run_orch

from orchestrator.outcome.rank_ends import TIE_S

pytestmark = pytest.mark.sandbox

RUNS = int(os.environ.get("ORCH_FIRST_FAILURE_RUNS", "1"))


@pytest.fixture(scope="module")
def two_by_two(sandbox_factory):
    _box, state = sandbox_factory(2, 2)
    return state


def _roles(record: dict) -> dict[int, str]:
    return {entry["rank"]: entry["role"] for entry in record["ranks"]}


@pytest.mark.parametrize("launcher", ["pdsh", "standard", "torchrun"])
def test_the_rank_that_exits_first_is_named_with_its_own_code(two_by_two, tmp_path, launcher):
    nodes = [n.name for n in two_by_two.nodes]
    for attempt in range(RUNS):
        runs = tmp_path / f"runs{attempt}"
        args = launch_args(two_by_two.hostfile, launcher, *RACE, "--fail-rank", "3",
                           "--exit-code", "7", nproc=2)  # fmt: skip
        result = run_orch(args, runs)
        summary = f"run {attempt + 1} of {RUNS}:\n{result.stderr[-3000:]}"
        assert result.returncode == 7, summary
        assert f"first failure: {nodes[1]} rank 3: exited with code 7" in result.stderr, summary
        (job_id,) = job_ids(runs)
        record = job_json(runs, job_id)
        assert record["exit_code"] == 7
        assert record["first_failure"]["rank"] == 3
        roles = _roles(record)
        assert roles[3] == "cause", record["ranks"]
        assert set(roles) == {0, 1, 2, 3}
        assert all(roles[r] == "consequence" for r in (0, 1, 2)), record["ranks"]
        by_rank = {entry["rank"]: entry for entry in record["ranks"]}
        assert by_rank[3]["node"] == nodes[1] and by_rank[3]["local_rank"] == 1
        # Each end is when its keeper woke: on a loaded node a peer's keeper can wake a few
        # milliseconds before the cause's, which the roles above already allow for (TIE_S).
        assert all(by_rank[r]["end"] > by_rank[3]["end"] - TIE_S for r in (0, 1, 2))
        # Every rank's own start and pid, as `orch status --json` shows them.
        status = run_orch(["status", job_id, "--json"], runs)
        assert '"role": "cause"' in status.stdout
        for node in nodes:  # and the failure left nothing of the job on any node
            assert job_processes(node, job_id) == [], f"job left running on {node}"


def _fault(state, tmp_path, launcher: str, *fault: str) -> tuple[str, dict]:
    """Run the race with this fault; the summary and the job's ranks by rank."""
    runs = tmp_path / "runs"
    result = run_orch(launch_args(state.hostfile, launcher, *RACE, *fault, nproc=2), runs)
    (job_id,) = job_ids(runs)
    record = job_json(runs, job_id)
    assert record["exit_code"] == result.returncode, result.stderr[-3000:]
    return result.stderr, {entry["rank"]: entry for entry in record["ranks"]}


def test_a_rank_killed_from_outside_is_named_with_exit_137(two_by_two, tmp_path):
    summary, by_rank = _fault(two_by_two, tmp_path, "pdsh", "--kill-rank", "1")
    nodes = [n.name for n in two_by_two.nodes]
    assert "exit code 137" in summary, summary[-3000:]
    assert f"first failure: {nodes[0]} rank 1: killed by SIGKILL" in summary
    assert (by_rank[1]["role"], by_rank[1]["signal"], by_rank[1]["exit_code"]) == (
        "cause", "SIGKILL", 137)
    assert all(by_rank[r]["role"] == "consequence" for r in (0, 2, 3)), by_rank


def test_a_rank_that_segfaults_is_named_with_exit_139_and_its_python_frame(two_by_two,
                                                                          tmp_path):
    summary, by_rank = _fault(two_by_two, tmp_path, "torchrun", "--segfault-rank", "2")
    nodes = [n.name for n in two_by_two.nodes]
    assert "exit code 139" in summary, summary[-3000:]
    assert f"first failure: {nodes[1]} rank 2: killed by SIGSEGV" in summary
    assert "hint: SIGSEGV in native code at " in summary and "in string_at" in summary
    assert by_rank[2]["role"] == "cause"
