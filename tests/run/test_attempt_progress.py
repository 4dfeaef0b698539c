"""How far an attempt got, as run/ hands it to the restart policy: the furthest step any rank
showed (the progress recorder's, logs/progress.py) and how long the attempt ran; and the
attempts loop's memory of the last attempt's progress. On values, in process."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.logs.progress import ProgressRecorder
from orchestrator.outcome.restart_policy import AttemptProgress, RestartPolicy, attempt_progress
from orchestrator.outcome.states import JobState
from orchestrator.records.job import FirstFailure, JobRecord
from orchestrator.records.rundir import RunDir
from orchestrator.run.job import _Recovery
from orchestrator.specs.words import Fanout


def test_the_furthest_step_of_any_rank_and_the_time_to_the_failure(tmp_path):
    recorder = ProgressRecorder(RunDir(tmp_path), now=100.0)
    for second in range(30):
        recorder.now = 100.0 + second
        recorder.line("n1", "0/0", b"step %d loss 0.5" % (10 * second))
        recorder.frame("n2", "1/0", b"%d/900 [00:01<00:01, 10.0it/s]" % (12 * second))
        recorder.line("n2", "1/0", b"Traceback (most recent call last):")
        recorder.line("n1", "", b"[launcher] waiting")  # the node's own line: no rank
    recorder.close()
    assert recorder.steps == {0: 290, 1: 348}
    got = attempt_progress(recorder.steps, started=50.0, ended=137.5)
    assert got == AttemptProgress(furthest_step=348, duration_s=87.5)


def test_an_attempt_without_steps_or_a_start():
    assert attempt_progress({}, started=10.0, ended=13.0) == AttemptProgress(None, 3.0)
    assert attempt_progress({}, started=None, ended=13.0) == AttemptProgress(None, 0.0)


TORCH_LINE = '  File "/v/torch/distributed/distributed_c10d.py", line 2501, in all_reduce'


def _nccl(node: str, rank: int, code: str) -> FirstFailure:
    exception = f"torch.distributed.DistBackendError: NCCL error: {code}"
    lines = ("Traceback (most recent call last):", TORCH_LINE, exception)
    return FirstFailure(node=node, rank=rank, exit_code=1, reason="exited with code 1",
                        root_cause=exception, root_cause_rank=rank, traceback=lines)  # fmt: skip


def _failed_attempt(number: int) -> JobRecord:
    return JobRecord(id="j1", state=JobState.FAILED, launcher="torchrun", command=("t.py",),
                     hosts=("n1", "n2"), workdir="/w", started_at="", head_pid=1,
                     head_start=None, attempt=number)  # fmt: skip


def test_the_loop_weighs_each_attempt_against_the_one_before():
    # No re-check over ssh: a Slurm fan-out.
    plan = SimpleNamespace(hosts=("n1", "n2"), job=SimpleNamespace(fanout=Fanout.SRUN))
    job = SimpleNamespace(pool=None, plan=plan)
    state = _Recovery(RestartPolicy(max_restarts=5), wanted=2, minimum=2)
    first, _, _ = state.after(job, _failed_attempt(1), _nccl("n2", 3, "ncclRemoteError"),
                              AttemptProgress(400, 95.0))  # fmt: skip
    further, _, _ = state.after(job, _failed_attempt(2), _nccl("n1", 0, "ncclSystemError"),
                                AttemptProgress(812, 90.0))  # fmt: skip
    assert first.restart and further.restart
    assert "(it reached step 812, the attempt before reached step 400)" in further.why
    stuck, _, _ = state.after(job, _failed_attempt(3), _nccl("n2", 3, "ncclRemoteError"),
                              AttemptProgress(812, 30.0))  # fmt: skip
    assert not stuck.restart and "with no progress in between" in stuck.why
