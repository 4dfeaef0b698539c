"""Restarts with real faults on real sandbox nodes (1 rank each, torchrun, gloo): a node that
dies for good mid-job (every process of it killed, its sshd too) is replaced by a spare, or
the job goes on smaller down to --min-nodes, and the script resumes from its checkpoint by
ORCH_RESTART_COUNT; a hang on the first attempt is restarted and finishes; the script's own
exit code is not restarted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from launch_support import (
    ORCH,
    REPO,
    free_port,
    job_ids,
    job_json,
    run_orch,
    slurm_env,
    start_orch,
    wait_for,
)

pytestmark = pytest.mark.sandbox

RESUMABLE = str(REPO / "tests" / "jobs" / "resumable.py")


def _args(hostfile: object, checkpoint: Path, *more: str,
          script: tuple[str, ...] = ()) -> list[str]:  # fmt: skip
    return [
        "launch", "--hostfile", str(hostfile), "--launcher", "torchrun", "--nproc-per-node", "1",
        "--main-port", str(free_port()), "--no-doctor", *more,
        RESUMABLE, "--", "--checkpoint", str(checkpoint), *script,
    ]  # fmt: skip


def _step(checkpoint: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(json.loads(checkpoint.read_text())["step"])
    return 0


def _kill_node(box, name: str) -> None:
    """The node dies for good: every process of it, its sshd among them."""
    for pid in box.node_pids(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class _RecordSeen:
    """Every (state, number of attempts) the job's record showed while orch ran, as a user
    polling `orch status --json` sees them."""

    def __init__(self, runs: Path, orch: subprocess.Popen) -> None:
        self.seen: list[tuple[str, int]] = []
        self._runs, self._orch = runs, orch
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while self._orch.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                for path in self._runs.glob("*/job.json"):
                    record = json.loads(path.read_text())
                    seen = (record["state"], len(record.get("attempts", ())))
                    if not self.seen or self.seen[-1] != seen:
                        self.seen.append(seen)
            time.sleep(0.02)

    def states(self) -> list[tuple[str, int]]:
        self._thread.join(timeout=10)
        return self.seen


def _run_and_kill(box, state, tmp_path: Path, victim: str,
                  *more: str) -> tuple[int, str, Path, list[tuple[str, int]]]:  # fmt: skip
    """Launch the resumable job on the sandbox, kill `victim` once it checkpointed step 3;
    its exit code, its output, its runs directory and what its record showed meanwhile."""
    runs, checkpoint, log = tmp_path / "runs", tmp_path / "ckpt.json", tmp_path / "orch.log"
    args = _args(state.hostfile, checkpoint, "--max-restarts", "2", *more,
                 script=("--steps", "30", "--step-sleep", "0.3"))  # fmt: skip
    orch = start_orch(args, runs, log)
    seen = _RecordSeen(runs, orch)
    try:
        assert wait_for(lambda: _step(checkpoint) >= 3, 120, 0.1), log.read_text()[-3000:]
        _kill_node(box, victim)
        code = orch.wait(timeout=300)
    finally:
        if orch.poll() is None:
            orch.kill()
    return code, log.read_text(), runs, seen.states()


def _attempts(runs: Path) -> tuple[str, list[dict]]:
    (job_id,) = job_ids(runs)
    return job_id, job_json(runs, job_id)["attempts"]


def test_a_node_killed_mid_job_is_replaced_by_a_spare_and_the_job_resumes(sandbox_factory,
                                                                          tmp_path):  # fmt: skip
    box, state = sandbox_factory(3, 1)
    first, victim, spare = (n.name for n in state.nodes)
    code, said, runs, seen = _run_and_kill(box, state, tmp_path, victim, "--nodes", "2")
    assert code == 0, said[-4000:]
    job_id, attempts = _attempts(runs)
    assert [a["number"] for a in attempts] == [1, 2]
    # Polled meanwhile, the record never called the job ended before it had: not failed while
    # the restart followed, not succeeded before the second attempt was in it.
    ended = [(state, count) for state, count in seen if state in ("failed", "succeeded")]
    assert ended == [("succeeded", 2)], seen
    assert ("starting", 1) in seen, seen
    assert attempts[0]["nodes"] == [first, victim] and attempts[1]["nodes"] == [first, spare]
    assert attempts[0]["cause"]["class"] == "node-lost"
    assert victim in attempts[0]["cause"]["message"] and attempts[0]["excluded"] == [victim]
    assert attempts[1]["exit_code"] == 0 and attempts[1]["cause"] is None
    assert "attempt 1 ended, exit code" in said and f"dropped: {victim}" in said
    assert f"attempt 2 in 2 s on {first}, {spare}" in said
    # The ranks of the second attempt resumed from the checkpoint, not from step 0.
    resumed = [line for line in said.splitlines() if "restart 1 starts at step" in line]
    assert resumed and all(not line.endswith(" step 0") for line in resumed), said[-4000:]
    assert "rank 0 done: 30 steps, restart 1" in said
    # Each attempt's logs stay apart: the latest by default, the first with --attempt 1.
    latest = run_orch(["logs", job_id, "--node", spare], runs)
    assert "restart 1 starts at step" in latest.stdout
    earlier = run_orch(["logs", job_id, "--attempt", "1", "--node", victim], runs)
    assert earlier.returncode == 0 and "restart 0 starts at step 0" in earlier.stdout
    status = json.loads(run_orch(["status", job_id, "--json"], runs).stdout)
    assert len(status["attempts"]) == 2 and status["state"] == "succeeded"
    # Each attempt leaves its page: the first's beside its logs, failed; the job's lists both
    # attempts and marks the restart on its timeline.
    first_page = (runs / job_id / "attempts" / "1" / "report.html").read_text()
    assert f'<section id="cause" data-node="{victim}"' in first_page
    page = (runs / job_id / "report.html").read_text()
    assert "The job ran 2 times under one id" in page and "attempt 2: " in page


def test_without_a_spare_the_job_goes_on_smaller_down_to_min_nodes(sandbox_factory, tmp_path):
    box, state = sandbox_factory(3, 1)
    names = [n.name for n in state.nodes]
    code, said, runs, _seen = _run_and_kill(box, state, tmp_path, names[2], "--min-nodes", "2")
    assert code == 0, said[-4000:]
    _job_id, attempts = _attempts(runs)
    assert attempts[1]["nodes"] == names[:2]
    assert "the world size changes from 3 to 2 ranks" in said
    assert "rank 1/2 restart 1 starts at step" in said  # the second attempt's world is 2


@pytest.fixture(scope="module")
def pair(sandbox_factory):
    return sandbox_factory(2, 1)[1]


def test_a_hang_on_the_first_attempt_is_restarted_and_finishes(pair, tmp_path):
    runs, checkpoint = tmp_path / "runs", tmp_path / "ckpt.json"
    args = _args(pair.hostfile, checkpoint, "--max-restarts", "1", "--hang-timeout", "10",
                 script=("--steps", "6", "--step-sleep", "0.1", "--hang-at", "3"))  # fmt: skip
    result = run_orch(args, runs)
    assert result.returncode == 0, result.stderr[-4000:]
    _job_id, attempts = _attempts(runs)
    assert [a["exit_code"] for a in attempts] == [124, 0]
    said = result.stdout + result.stderr
    assert attempts[0]["cause"]["class"] == "hang" and attempts[0]["excluded"] == []
    # Resumed where the stuck rank stopped: the first attempt's quiet start-up was no hang.
    assert "restart 1 starts at step 3" in said, (attempts[0]["cause"], said[-3000:])


def test_the_scripts_own_exit_code_is_not_restarted(pair, tmp_path):
    runs, checkpoint = tmp_path / "runs", tmp_path / "ckpt.json"
    args = _args(pair.hostfile, checkpoint, "--max-restarts", "2",
                 script=("--steps", "4", "--step-sleep", "0.1", "--exit-at", "1"))  # fmt: skip
    result = run_orch(args, runs)
    assert result.returncode == 7, result.stderr[-4000:]
    _job_id, attempts = _attempts(runs)
    assert len(attempts) == 1 and attempts[0]["cause"]["class"] == "script"
    assert "recovery: script: the script's own error; not restarted" in result.stderr
    assert "--restart-on any" in result.stderr


def test_inside_slurm_a_node_taken_down_is_replaced_by_a_spare_of_the_allocation(
    sandbox_factory, tmp_path
):
    _box, state = sandbox_factory(3, 1, slurm=True)
    names = [n.name for n in state.nodes]
    runs, checkpoint, log = tmp_path / "runs", tmp_path / "ckpt.json", tmp_path / "salloc.log"
    args = _args("-", checkpoint, "--max-restarts", "1", "--nodes", "2",
                 script=("--steps", "30", "--step-sleep", "0.3"))  # fmt: skip
    args[1:3] = ["--slurm"]  # the allocation's nodes, not a hostfile
    env = slurm_env(state, runs)
    # --no-kill: the allocation outlives a node that fails, so the job can go on in it.
    argv = ["salloc", "-N3", "--no-kill", "--ntasks-per-node=1", *ORCH, *args]
    down = ["scontrol", "update", f"nodename={names[1]}"]
    with log.open("wb") as out:
        salloc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: _step(checkpoint) >= 3, 180, 0.1), log.read_text()[-3000:]
        subprocess.run([*down, "state=down", "reason=ECC errors on GPU 3"], env=env, check=True,
                       timeout=30)  # fmt: skip
        code = salloc.wait(timeout=300)
    finally:
        if salloc.poll() is None:
            salloc.kill()
        subprocess.run([*down, "state=resume"], env=env, check=False, timeout=30)
    said = log.read_text(errors="replace")
    assert code == 0, said[-4000:]
    _job_id, attempts = _attempts(runs)
    assert [a["nodes"] for a in attempts] == [names[:2], [names[0], names[2]]]
    assert attempts[0]["cause"]["class"] == "node-lost"
    assert f"Slurm took {names[1]} out" in attempts[0]["cause"]["message"]
    assert "restart 1 starts at step" in said and "restart 1 starts at step 0" not in said
