"""`orch submit --sbatch --requeue` on the sandbox's Slurm: a job that needs more than one
allocation saves at its time limit, orch requeues it from the batch shell, and the next
allocation resumes it from the saved step under the same job id, in the same record; a
script that requeues itself (rank 0 runs `scontrol requeue` on the stop signal) is requeued
once, not twice; a real Lightning fit is requeued by orch alone and resumes from the checkpoint
its `OnExceptionCheckpoint` saved; a job preempted by one of the `urgent` partition saves in
Slurm's grace and goes on after it; a job the user cancels (`scancel`) is not requeued.

Slurm holds a requeued job back for about two minutes (its BeginTime) before it may start
again; the tests let it start at once (`scontrol update StartTime=now`), as a user may. Slurm's
warning may come up to a minute before the `--signal` time asked for, so how far the first
allocation gets varies: the next one is given the time for the rest (`TimeLimit=10`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from launch_support import ORCH, REPO, job_json, log_text, run_orch, slurm_env, wait_for

from orchestrator.sandbox.slurm import KILL_WAIT_S, PREEMPT_GRACE_S, URGENT_PARTITION
from orchestrator.specs.slurm import SLURM_KILL_WAIT_KEPT_S, parse_job_view

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]
REQUEUEABLE = str(REPO / "tests" / "jobs" / "requeueable.py")
LIGHTNING_FIT = str(REPO / "tests" / "jobs" / "lightning_fit.py")


@pytest.fixture(scope="module")
def slurm_box(sandbox_factory):
    _box, state = sandbox_factory(2, 1, slurm=True)
    return state


def _slurm(state, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=slurm_env(state, Path("/nonexistent")),
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip


def _recipe(tmp_path: Path, *args: str, time: str, stop: str = "", script: str = REQUEUEABLE,
            launcher: str = "torchrun") -> Path:  # fmt: skip
    recipe = tmp_path / "requeueable.yaml"
    saves = ["--checkpoint", str(tmp_path / "step.json")] if script == REQUEUEABLE else []
    recipe.write_text(
        "name: requeueable\n"
        f"script: {script}\n"
        f"args: {json.dumps([*saves, *args])}\n"
        f"launcher: {launcher}\n"
        "nproc_per_node: 1\n"
        "env: {OMP_NUM_THREADS: 1}\n"
        "hang_timeout: 120\n"
        f"{stop}"
        f"slurm:\n  nodes: 2\n  time: '{time}'\n"
    )
    return recipe


def _submit(state, runs: Path, recipe: Path) -> tuple[str, str]:
    """The job's id and its Slurm job's, submitted with --requeue."""
    done = subprocess.run([*ORCH, "submit", str(recipe), "--sbatch", "--requeue", "--no-doctor"],
                          cwd=REPO, env=slurm_env(state, runs), capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    return job_id, job_json(runs, job_id)["slurm_job_id"]


def _restarts(state, slurm_job: str) -> int | None:
    view = parse_job_view(_slurm(state, "scontrol", "show", "job", "-o", slurm_job).stdout)
    return None if view is None else view.restarts


def _started_again(state, runs: Path, job_id: str, slurm_job: str, *more: str) -> None:
    """Once orch has recorded the requeue and Slurm holds the job pending, let it start (with
    `more` of scontrol's settings for the next allocation)."""
    def requeued() -> bool:
        record = job_json(runs, job_id)
        return record["state"] == "queued" and (record.get("requeue") or {}).get("by") in (
            "orch", "slurm")  # fmt: skip

    assert wait_for(requeued, 240), _output(runs, job_id)[-4000:]
    pending = lambda: _slurm(state, "squeue", "-h", "-j", slurm_job, "-o", "%T").stdout.strip()  # noqa: E731
    assert wait_for(lambda: pending() == "PENDING", 90), pending()
    done = _slurm(state, "scontrol", "update", f"JobId={slurm_job}", "StartTime=now", *more)
    assert done.returncode == 0, done.stderr


def _output(runs: Path, job_id: str) -> str:
    """The batch job's output, every allocation's."""
    path = runs / job_id / "sbatch.out"
    return path.read_text(errors="replace") if path.exists() else "(no sbatch.out)"


def _succeeded(state, runs: Path, job_id: str) -> dict:
    ended = wait_for(lambda: job_json(runs, job_id)["state"] in ("succeeded", "failed",
                                                                    "stopped"), 240)  # fmt: skip
    record = job_json(runs, job_id)
    if not ended:  # what Slurm and the record say of a job that did not end in time
        queue = _slurm(state, "scontrol", "show", "job", "-o", record["slurm_job_id"]).stdout
        queue += _slurm(state, "sinfo", "-N", "-h", "-o", "%N %T %E").stdout
        raise AssertionError(f"state {record['state']}, requeue {record.get('requeue')}\n"
                             f"{queue}\n{_output(runs, job_id)[-4000:]}")  # fmt: skip
    assert record["state"] == "succeeded", _output(runs, job_id)[-4000:]
    # The summary follows the record's end.
    assert wait_for(lambda: f"job {job_id} succeeded" in _output(runs, job_id), 30)
    return record


def _warned_once_running(state, runs: Path, recipe: Path) -> tuple[str, str, dict, str]:
    """Submitted with --requeue, warned by Slurm once every rank runs, started again after the
    requeue, succeeded: the job's id, its Slurm job's, its record and the batch output."""
    job_id, slurm_job = _submit(state, runs, recipe)
    names = [node.name for node in state.nodes]
    up = lambda: all("starts at step" in log_text(runs, job_id, n) for n in names)  # noqa: E731
    assert wait_for(up, 180), _output(runs, job_id)[-4000:]
    # Slurm's warning (what `#SBATCH --signal=B:USR1@...` sends) to orch's batch shell.
    warned = _slurm(state, "scancel", "--batch", "--signal=USR1", slurm_job)
    assert warned.returncode == 0, warned.stderr
    _started_again(state, runs, job_id, slurm_job)
    record = _succeeded(state, runs, job_id)
    return job_id, slurm_job, record, _output(runs, job_id)


def _resumed_at(runs: Path, job_id: str, node: str) -> str:
    text = log_text(runs, job_id, node)
    return text[text.index("restart "):].split("\n")[0]


def test_a_job_stopped_at_its_time_limit_saves_and_goes_on_in_the_next_allocation(
    slurm_box, tmp_path
):
    state = slurm_box
    runs = tmp_path / "runs"
    # Three minutes of allocation, a 10 s grace: the job is stopped at most 110 s after the
    # allocation began (its end less the grace and a minute), or at Slurm's warning, which
    # `--signal=B:USR1@70` asks for 70 s before the end and Slurm may send up to 60 s early:
    # 50 s after the allocation began at the soonest, once the ranks run (with 2 minutes the
    # warning could come before they had started, and nothing was saved). Long before
    # its 240 steps of half a second are done.
    recipe = _recipe(tmp_path, "--steps", "240", "--step-sleep", "0.5", time="3",
                     stop="stop_grace: 10\n")  # fmt: skip
    job_id, slurm_job = _submit(state, runs, recipe)
    _started_again(state, runs, job_id, slurm_job, "TimeLimit=10")
    step_file = tmp_path / "step.json"
    assert step_file.is_file(), _output(runs, job_id)[-3000:]
    saved = json.loads(step_file.read_text())["step"]
    assert 0 <= saved < 240
    record = _succeeded(state, runs, job_id)
    text = _output(runs, job_id)
    assert "2 of 2 ranks exited by themselves" in text
    assert "requeued (`scontrol requeue`), it goes on in allocation 2 (requeue 1 of at most " \
        "10)" in text  # fmt: skip
    assert record["attempts"][0]["cause"]["message"] in (
        "stopped by the Slurm allocation's time limit", "stopped by Slurm (its warning, or a "
        "preemption)")  # fmt: skip
    assert f"job {job_id} succeeded" in text  # every allocation's output, in the one file
    first, second = record["attempts"]
    assert (first["allocation"], second["allocation"]) == (1, 2)
    assert "it goes on in allocation 2" in first["cause"]["decision"]
    assert first["logs"] == "attempts/1/logs" and record["allocation"] == 2
    node = record["hosts"][0]
    first_log = (runs / job_id / "attempts" / "1" / "logs" / f"{node}.log").read_text()
    assert f"rank 0 saved at step {saved}" in first_log and " done: " not in first_log
    # ORCH_RESTART_COUNT counts on: the next allocation's ranks resume from the saved step.
    assert _resumed_at(runs, job_id, node) == f"restart 1 starts at step {saved}"
    assert "rank 0 done: 240 steps, restart 1" in log_text(runs, job_id, node)
    assert record["requeue"]["by"] == "none"  # it succeeded: nothing more to requeue
    assert _restarts(state, slurm_job) == 1
    status = run_orch(["status", job_id], runs).stdout
    assert "attempts: 2 in 2 Slurm allocations" in status and "2 (allocation 2)" in status


def test_a_script_that_requeues_itself_is_not_requeued_twice(slurm_box, tmp_path):
    state = slurm_box
    runs = tmp_path / "runs"
    # A requeue signal of its own (SIGUSR1, as scripts written for Slurm choose) as the stop.
    recipe = _recipe(tmp_path, "--steps", "80", "--step-sleep", "0.25", "--requeue-itself",
                     time="10", stop="stop_signal: SIGUSR1\nstop_grace: 30\n")  # fmt: skip
    job_id, slurm_job, record, text = _warned_once_running(state, runs, recipe)
    names = [node.name for node in state.nodes]
    assert "rank 0 requeued Slurm job" in text or "rank 0 requeued Slurm job" in (
        runs / job_id / "attempts" / "1" / "logs" / f"{names[0]}.log").read_text()
    assert "requeue: Slurm has requeued the job already (the script's own `scontrol requeue`" \
        in text  # fmt: skip
    first, second = record["attempts"]
    assert "not requeued a second time" in first["cause"]["decision"]
    assert second["allocation"] == 2
    saved = json.loads((tmp_path / "step.json").read_text())["step"]
    assert _resumed_at(runs, job_id, names[0]) == f"restart 1 starts at step {saved}"
    assert _restarts(state, slurm_job) == 1  # once: by the script, not again by orch


def test_a_lightning_fit_is_requeued_by_orch_alone_and_resumes_from_its_own_checkpoint(
    slurm_box, tmp_path
):
    """Real Lightning under orch's torchrun: it picks its TorchElastic environment, so its own
    SLURM requeue never runs. At Slurm's warning orch stops the job with SIGTERM, Lightning
    tells every rank at the next step, `OnExceptionCheckpoint` saves and the ranks exit 0;
    orch requeues it once, and the next allocation's fit resumes from that checkpoint."""
    state = slurm_box
    runs = tmp_path / "runs"
    recipe = _recipe(tmp_path, "--checkpoint-dir", str(tmp_path / "checkpoints"), "--steps",
                     "120", "--step-sleep", "0.25", "--save-seconds", "5", time="10",
                     stop="stop_grace: 30\n", script=LIGHTNING_FIT)  # fmt: skip
    job_id, slurm_job, record, text = _warned_once_running(state, runs, recipe)
    names = [node.name for node in state.nodes]
    assert "stopped by Slurm (its warning, or a preemption): 2 of 2 ranks exited by " \
        "themselves" in text, text[-4000:]  # fmt: skip
    assert "requeued (`scontrol requeue`), it goes on in allocation 2" in text
    first, second = record["attempts"]
    assert "not requeued a second time" not in first["cause"]["decision"]
    assert second["allocation"] == 2
    first_log = (runs / job_id / "attempts" / "1" / "logs" / f"{names[0]}.log").read_text()
    saved = [line.split("saved at step ")[1].split()[0] for line in first_log.splitlines()
             if "rank 0 saved at step" in line]  # fmt: skip
    assert saved and "(SIGTERMException)" in first_log, first_log[-3000:]
    assert _resumed_at(runs, job_id, names[0]) == f"restart 1 starts at step {saved[0]}"
    assert "rank 0 done: 120 steps" in log_text(runs, job_id, names[0])
    assert _restarts(state, slurm_job) == 1  # once, by orch: Lightning did not requeue


@pytest.mark.parametrize("launcher", ["torchrun", "pdsh"])
def test_a_preempted_job_saves_in_slurms_grace_and_goes_on_after_the_preemptor(slurm_box,
                                                                                tmp_path,
                                                                                launcher):
    """The sandbox's Slurm preempts with requeue after a grace (PreemptMode=REQUEUE,
    GraceTime): it sends SIGTERM to every process of the job's srun steps, torchrun's among
    them, and no warning to orch's batch shell; the pdsh launcher reaches the nodes over ssh,
    with no step to signal, and orch learns of it from the allocation's end moving forward.
    orch stops the job as its own stop would: every rank saves for longer than its launcher's
    own 30 s and exits by itself; orch requeues the job; the next allocation resumes from the
    saved step."""
    state = slurm_box
    runs = tmp_path / "runs"
    grace = 50
    assert grace + 10 < PREEMPT_GRACE_S  # the stop fits in what Slurm grants
    # Long enough for Slurm to see the preemptor and preempt: its scheduler may take a while.
    recipe = _recipe(tmp_path, "--steps", "120", "--step-sleep", "0.5", "--save-seconds", "40",
                     time="10", stop=f"stop_grace: {grace}\n", launcher=launcher)  # fmt: skip
    job_id, slurm_job = _submit(state, runs, recipe)
    names = [node.name for node in state.nodes]
    stepping = lambda: all("step 10" in log_text(runs, job_id, n) for n in names)  # noqa: E731
    assert wait_for(stepping, 180), _output(runs, job_id)[-4000:]
    urgent = _slurm(state, "sbatch", "--partition", URGENT_PARTITION, "--nodes", "2",
                    "--output", "/dev/null", "--wrap", "sleep 5")  # fmt: skip
    assert urgent.returncode == 0, urgent.stderr
    _started_again(state, runs, job_id, slurm_job)
    record = _succeeded(state, runs, job_id)
    text = _output(runs, job_id)
    assert "stopped by Slurm (its warning, or a preemption): 2 of 2 ranks exited by " \
        "themselves" in text, text[-4000:]  # fmt: skip
    assert "requeued (`scontrol requeue`), it goes on in allocation 2" in text
    first, second = record["attempts"]
    assert first["cause"]["message"] == "stopped by Slurm (its warning, or a preemption)"
    assert second["allocation"] == 2
    saved = json.loads((tmp_path / "step.json").read_text())["step"]
    assert 10 <= saved < 120
    first_log = (runs / job_id / "attempts" / "1" / "logs" / f"{names[0]}.log").read_text()
    assert f"rank 0 saved at step {saved}" in first_log
    assert _resumed_at(runs, job_id, names[0]) == f"restart 1 starts at step {saved}"
    assert "rank 0 done: 120 steps, restart 1" in log_text(runs, job_id, names[0])


def test_a_job_the_user_cancels_saves_within_slurms_kill_wait_and_is_not_requeued(slurm_box,
                                                                                  tmp_path):
    """`scancel` TERMs orch's batch shell and every step: Slurm SIGKILLs what is left
    KillWait seconds later, so orch cuts the grace to end before it, writes the record and
    says why the job is not requeued (the user cancelled it), all before Slurm's SIGKILL."""
    state = slurm_box
    runs = tmp_path / "runs"
    recipe = _recipe(tmp_path, "--steps", "200", "--step-sleep", "0.5", "--save-seconds", "40",
                     time="10", stop="stop_grace: 120\n")  # fmt: skip
    job_id, slurm_job = _submit(state, runs, recipe)
    names = [node.name for node in state.nodes]
    stepping = lambda: all("step 10" in log_text(runs, job_id, n) for n in names)  # noqa: E731
    assert wait_for(stepping, 180), _output(runs, job_id)[-4000:]
    cancelled = _slurm(state, "scancel", slurm_job)
    assert cancelled.returncode == 0, cancelled.stderr
    # The record says the job stopped, then (after asking Slurm) whether it is requeued.
    decided = lambda: job_json(runs, job_id).get("requeue") is not None  # noqa: E731
    assert wait_for(decided, 120), _output(runs, job_id)[-4000:]
    record = job_json(runs, job_id)
    assert record["state"] == "stopped", _output(runs, job_id)[-4000:]
    assert record["requeue"]["by"] == "none"
    assert "Slurm is ending the job itself" in record["requeue"]["why"]
    text = _output(runs, job_id)
    cut = KILL_WAIT_S - SLURM_KILL_WAIT_KEPT_S
    # The ranks, saving for 40 s, are killed when the grace Slurm leaves is over.
    assert f"killed at the end of the {cut:.0f} s grace (cut from 120 s: Slurm ends the job " \
        f"{KILL_WAIT_S} s after its SIGTERM, its KillWait)" in text, text[-4000:]  # fmt: skip
    # The stop may begin a moment before the head's own SIGTERM (a node's agent told of
    # Slurm's first): the grace in force is then that moment longer.
    assert cut <= record["stop"]["grace"] < cut + 1 and record["stop"]["ending"] == "grace-over"
    assert "requeue: Slurm is ending the job itself" in text
    assert _restarts(state, slurm_job) in (0, None)  # not requeued, by orch nor by Slurm
