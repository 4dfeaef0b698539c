"""Each attempt's files kept apart in the job's record, and found again by number."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.errors import UsageError
from orchestrator.outcome.states import JobState
from orchestrator.records.attempts import attempt_run_dir, carried_over, keep_apart, with_attempt
from orchestrator.records.job import AttemptRecord, JobRecord
from orchestrator.records.rundir import RunDir


def _record(**changes: object) -> JobRecord:
    base: dict[str, object] = dict(id="j1", state=JobState.FAILED, launcher="torchrun",
                                   command=("x",), hosts=("n1", "n2"), workdir="/w",
                                   started_at="t0", head_pid=1, head_start=None)  # fmt: skip
    return JobRecord(**{**base, **changes})  # type: ignore[arg-type]


def test_an_attempts_logs_and_stacks_move_apart_and_are_found_by_number(tmp_path):
    run = RunDir(tmp_path / "j1").create()
    (run.logs / "n2.log").write_text("attempt one\n")
    (run.path / "stacks").mkdir()
    (run.path / "stacks" / "s.json").write_text("{}")
    first = AttemptRecord(number=1, nodes=("n1", "n2"), started="t0", exit_code=1,
                          cause={"class": "node-lost", "message": "m", "decision": "d"},
                          excluded=("n2",), stacks="stacks/s.json")  # fmt: skip
    kept = keep_apart(run, first)
    assert (kept.logs, kept.stacks) == ("attempts/1/logs", "attempts/1/stacks/s.json")
    assert (run.path / kept.logs / "n2.log").read_text() == "attempt one\n"
    assert not run.logs.exists()
    record = with_attempt(run, _record(hosts=("n1", "n2")), kept)
    assert (record.state, record.attempt) == (JobState.STARTING, 2)
    again = run.load()
    assert again.attempts == (kept,)  # job.json keeps it as it was
    assert attempt_run_dir(run, again, None) == (run, again)  # the latest: the job's own
    older_dir, older = attempt_run_dir(run, again, 1)
    assert older_dir.logs == run.path / "attempts" / "1" / "logs" and older.hosts == ("n1", "n2")
    with pytest.raises(UsageError, match="has no attempt 5"):
        attempt_run_dir(run, again, 5)



def test_a_batch_jobs_first_allocation_carries_nothing_over(tmp_path):
    run = RunDir(tmp_path / "j1").create()
    queued = _record(state=JobState.QUEUED, hosts=())  # as `orch submit --sbatch` wrote it
    assert carried_over(run, queued) is None


def test_a_requeued_batch_job_goes_on_with_its_attempts_and_its_last_ones_files_apart(tmp_path):
    run = RunDir(tmp_path / "j1").create()
    (run.logs / "n1.log").write_text("allocation one\n")
    ended = AttemptRecord(number=2, nodes=("n1", "n2"), started="t0", exit_code=124,
                          cause={"class": "stopped", "message": "m", "decision": "requeued"})
    earlier = AttemptRecord(number=1, nodes=("n1", "n2"), started="t0", logs="attempts/1/logs")
    record = _record(state=JobState.QUEUED, attempt=2, attempts=(earlier, ended))
    going_on = carried_over(run, record)
    assert going_on is not None and going_on.allocation == 2
    assert going_on.attempts == (earlier, replace(ended, logs="attempts/2/logs"))
    assert (run.path / "attempts" / "2" / "logs" / "n1.log").read_text() == "allocation one\n"
    assert run.load() == going_on  # saved before the next attempt starts


def test_an_attempt_whose_allocation_ended_before_its_end_was_written_is_kept(tmp_path):
    run = RunDir(tmp_path / "j1").create()
    record = _record(state=JobState.STOPPING, attempt=1, attempt_started="t1", allocation=1)
    going_on = carried_over(run, record)
    assert going_on is not None and going_on.allocation == 2
    [unfinished] = going_on.attempts
    assert (unfinished.number, unfinished.started, unfinished.allocation) == (1, "t1", 1)
    assert unfinished.cause is not None and unfinished.cause["decision"] == "Slurm requeued the job"
    assert unfinished.logs == "attempts/1/logs"
