"""The default path: accelerate + DeepSpeed's pdsh runner, wrapped by orch (real training
on CPU over gloo), plus the pre-flight that stops a launch that cannot work."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from launch_support import (
    REPO,
    free_port,
    job_ids,
    job_json,
    job_processes,
    log_text,
    run_orch,
)

from orchestrator.remote.agent_spec import runs_root

pytestmark = pytest.mark.sandbox
RECIPE = str(REPO / "recipes" / "cpu-smoke.yaml")


def _submit(hostfile: str, runs: Path, *script_args: str):
    args = ["submit", RECIPE, "--hostfile", hostfile, "--main-port", str(free_port()),
            "--no-doctor", "--", *script_args]  # fmt: skip
    return run_orch(args, runs, timeout=600)


@pytest.fixture(scope="module")
def pair(sandbox_factory):
    """Two nodes with two ranks each: a real multi-node job that fits two cores."""
    return sandbox_factory(2, 2)


@pytest.mark.slow
def test_cpu_smoke_recipe_trains_through_deepspeeds_pdsh_runner(pair, tmp_path, monkeypatch):
    _box, state = pair
    names = [n.name for n in state.nodes]
    home_env = Path.home() / ".deepspeed_env"
    home_before = home_env.read_text() if home_env.exists() else None
    # Exported on the head, words with spaces (as SSH_CONNECTION in every SSH login).
    note = "orch-test a phrase of several words"
    monkeypatch.setenv("ORCH_TEST_NOTE", note)
    result = _submit(state.hostfile, tmp_path, "--steps", "6")
    assert result.returncode == 0, result.stderr[-3000:]
    [job_id] = job_ids(tmp_path)
    for rank, node in enumerate(n for n in names for _ in range(2)):
        # Under the rank's own token: r<global rank>/<local rank>.
        log = log_text(tmp_path, job_id, node)
        assert f" r{rank}/{rank % 2} out rank {rank}/4 on {node}" in log
    assert " r0/0 out final loss" in log_text(tmp_path, job_id, names[0])
    record = job_json(tmp_path, job_id)
    assert record["state"] == "succeeded" and record["launcher"] == "pdsh"
    assert record["node_exit_codes"] == dict.fromkeys(names, 0)
    assert record["recipe"] == RECIPE
    run = tmp_path / job_id
    assert run.stat().st_mode & 0o777 == 0o700  # the record is its user's alone
    # The fan-out's own lines read clean: nothing orch set is warned of or written twice.
    head = (run / "logs" / "_head.log").read_text()
    assert "Skipping" not in head and "Skipping" not in result.stderr + result.stdout
    # Nothing of the head's environment is printed: not in the terminal, nor in any log.
    assert note not in result.stderr + result.stdout
    for log in run.rglob("*"):
        assert not log.is_file() or note not in log.read_text(errors="replace"), log
    [runner_line] = [line for line in head.splitlines() if "cmd = pdsh" in line]
    # DeepSpeed's runner puts the working directory first, then what the user had: once each.
    users = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    assert f"export PYTHONPATH={os.pathsep.join([str(REPO), *users])};" in runner_line
    assert "deepspeed_multinode_launcher: pdsh" in (run / "accelerate-pdsh.yaml").read_text()
    # The job's env went through a private per-job file: none is kept or left behind.
    assert not (run / "deepspeed_env").exists()
    assert not (REPO / ".deepspeed_env").exists()
    assert (home_env.read_text() if home_env.exists() else None) == home_before
    # The raw node-local logs came back: the launcher's, and each rank's own.
    assert record["node_logs"] == dict.fromkeys(names, "ok")
    assert (run / "nodes" / names[1] / "stdout.raw").read_text()
    for rank in (2, 3):
        own = (run / "nodes" / names[1] / f"rank{rank}.stdout.raw").read_text()
        assert f"rank {rank}/4 on {names[1]}" in own


@pytest.mark.slow
def test_failing_rank_through_deepspeed_is_named_and_torn_down(pair, tmp_path):
    _box, state = pair
    names = [n.name for n in state.nodes]
    result = _submit(state.hostfile, tmp_path, "--steps", "50", "--step-sleep", "0.2",
                     "--fail-rank", "3", "--exit-code", "7")  # fmt: skip
    assert result.returncode == 7, result.stderr[-3000:]
    assert f"first failure: {names[1]} rank 3" in result.stderr
    [job_id] = job_ids(tmp_path)
    for node in names:
        assert job_processes(node, job_id) == [], f"job left running on {node}"
    record = job_json(tmp_path, job_id)
    assert record["state"] == "failed" and record["exit_code"] == 7
    assert record["first_failure"]["node"] == names[1]


def _private_files(names: list[str]) -> set[Path]:
    """The job settings files orch writes on these sandbox nodes (which share this /tmp
    with every other sandbox on the machine, whose jobs come and go meanwhile)."""
    root = Path(runs_root(os.getuid()))
    return {path for name in names for path in root.glob(f"*/{name}/private.json")}


def test_failed_preflight_stops_the_launch_before_anything_runs(pair, tmp_path):
    _box, state = pair
    names = [n.name for n in state.nodes]
    before = _private_files(names)
    result = run_orch(
        ["launch", "--hostfile", state.hostfile, "--python", "/nonexistent/bin/python",
         "--main-port", str(free_port()), str(REPO / "tests" / "jobs" / "allreduce.py")],
        tmp_path,
    )  # fmt: skip
    assert result.returncode == 78  # the pre-flight found it: orch's own code, not the job's
    assert "pre-flight failed" in result.stderr
    assert "/nonexistent/bin/python" in result.stderr
    assert job_ids(tmp_path) == []
    assert _private_files(names) == before, "the job's settings were left on the nodes"
