"""The standard launcher: one accelerate config per machine rank, `accelerate launch` on
every node through pdsh and the agent, workers started once the main port answers. Its
failing rank (exit code, named, nothing left) is tests/run/test_first_failure_sandbox.py's,
with every launcher's."""

from __future__ import annotations

import pytest
from launch_support import job_ids, job_json, launch_args, log_text, run_orch

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]


@pytest.fixture(scope="module")
def pair(sandbox_factory):
    return sandbox_factory(2, 2)


def test_standard_launcher_runs_every_rank_with_its_machine_rank(pair, tmp_path):
    _box, state = pair
    names = [n.name for n in state.nodes]
    result = run_orch(launch_args(state.hostfile, "standard", "--steps", "2", nproc=2), tmp_path,
                      timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    [job_id] = job_ids(tmp_path)
    for rank in range(4):
        node = names[rank // 2]
        assert f" r{rank}/{rank % 2} out rank {rank} done\n" in log_text(tmp_path, job_id, node)
    run = tmp_path / job_id
    # Each node wrote its own config; it came back with the node's raw logs.
    assert "machine_rank: 1" in (run / "nodes" / names[1] / "accelerate-rank1.yaml").read_text()
    assert job_json(tmp_path, job_id)["node_exit_codes"] == dict.fromkeys(names, 0)

