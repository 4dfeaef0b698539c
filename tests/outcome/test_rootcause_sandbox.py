"""The root cause of a failure, on a real sandbox: one rank raises, its peers then fail with
gloo's lost-peer errors, and the summary and job.json show the raising rank's traceback first."""

from __future__ import annotations

import pytest
from launch_support import job_ids, job_json, launch_args, run_orch

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def sandbox(sandbox_factory):
    """2 nodes x 2 ranks (conftest's has 4 nodes): rank 3 raises on the second node."""
    return sandbox_factory(2, 2)


def test_the_raising_ranks_traceback_comes_before_the_cascade(sandbox, hostfile, tmp_path):
    runs = tmp_path / "runs"
    result = run_orch(launch_args(hostfile, "pdsh", "--raise-rank", "3", nproc=2), runs)
    assert result.returncode == 1, result.stderr
    (job_id,) = job_ids(runs)
    lines = result.stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("root cause: "))
    assert lines[at].endswith("rank 3: ValueError: batch 17 is corrupt (rank 3)")
    block = lines[at + 1 : lines.index(next(x for x in lines if x.startswith("first failure")))]
    assert block[0].endswith("Traceback (most recent call last):")
    assert any("in load_batch" in line for line in block)
    assert block[-1].endswith("ValueError: batch 17 is corrupt (rank 3)")
    # The peers did fail, with the cascade the summary ranks below the cause.
    record = job_json(runs, job_id)
    hosts = record["hosts"]
    logs = "".join((runs / job_id / "logs" / f"{n}.log").read_text() for n in hosts)
    assert "Connection closed by peer" in logs or "Connection reset by peer" in logs
    failure = record["first_failure"]
    assert failure["root_cause_rank"] == 3 and failure["root_cause_node"] == hosts[1]
    assert failure["root_cause"] == "ValueError: batch 17 is corrupt (rank 3)"
    assert failure["traceback"] == [line.removeprefix("  | ") for line in block]
