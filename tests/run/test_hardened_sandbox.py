"""A cluster whose sshd is configured as hardened clusters do: no SFTP subsystem, OpenSSH's
default session limits, no forwarding. Doctor passes, a job runs, its raw logs come back
(through `cat`), and a rank's exit code is the job's, with no traceback."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from launch_support import job_ids, job_json, job_processes, launch_args, log_text, run_orch

from orchestrator.remote.agent_spec import runs_root

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def hardened(sandbox_factory):
    return sandbox_factory(2, 2, sshd_profile="hardened")


def _names(state) -> list[str]:
    return [node.name for node in state.nodes]


def test_the_nodes_really_have_no_sftp(hardened):
    _box, state = hardened
    node = state.nodes[0].name
    text = (Path(state.directory) / "nodes" / node / "sshd_config").read_text()
    assert "Subsystem" not in text and "MaxSessions 10" in text
    sftp = subprocess.run(["sftp", "-b", "-", node], input="ls\n", capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert sftp.returncode != 0  # the node's sshd refuses the subsystem


def test_doctor_passes_without_sftp(hardened, tmp_path):
    _box, state = hardened
    result = run_orch(["doctor", "--hostfile", state.hostfile, "--json"], tmp_path, 180)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["findings"] == []
    checked = {node["node"]: node["checks"] for node in report["nodes"]}
    assert set(checked) == set(_names(state))
    for node, checks in checked.items():
        assert checks["ssh"] == "ok" and set(checks.values()) == {"ok"}, (node, checks)


def test_a_job_succeeds_and_every_raw_log_comes_back(hardened, tmp_path):
    _box, state = hardened
    result = run_orch(launch_args(state.hostfile, "torchrun", "--steps", "3", nproc=2), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    [job_id] = job_ids(tmp_path)
    record = job_json(tmp_path, job_id)
    assert record["node_logs"] == dict.fromkeys(_names(state), "ok")
    ranks = []
    for node in _names(state):
        raw = tmp_path / job_id / "nodes" / node
        assert (raw / "stdout.raw").is_file() and (raw / "stderr.raw").is_file()  # the launcher's
        # Each rank's own output, on its own channel, in files of its own.
        outs = sorted(raw.glob("rank*.stdout.raw"))
        assert len(outs) == 2, outs
        for path in outs:
            rank = int(path.name[len("rank") : -len(".stdout.raw")])
            ranks.append(rank)
            assert f"rank {rank} done" in path.read_text()
            assert (raw / f"rank{rank}.stderr.raw").is_file()
        # NCCL's flight recorder would dump into the node's run directory, which came back.
        stem = f"{runs_root(os.getuid())}/{job_id}/{node}/nccl_trace_rank_"
        assert f"fr={stem}" in log_text(tmp_path, job_id, node)
    assert sorted(ranks) == list(range(4))


def test_a_rank_that_exits_7_makes_the_job_exit_7(hardened, tmp_path):
    _box, state = hardened
    args = launch_args(state.hostfile, "torchrun", "--fail-rank", "3", "--exit-code", "7",
                       nproc=2)  # fmt: skip
    result = run_orch(args, tmp_path)
    assert result.returncode == 7, result.stderr
    assert "Traceback" not in "".join(
        line for line in result.stderr.splitlines(True) if not line.startswith(state.prefix)
    )
    [job_id] = job_ids(tmp_path)
    record = job_json(tmp_path, job_id)
    assert record["first_failure"]["rank"] == 3
    assert record["node_logs"] == dict.fromkeys(_names(state), "ok")
    for node in _names(state):
        assert job_processes(node, job_id) == []
