"""Each attempt's files kept apart in the job's record, and found again by number."""

from __future__ import annotations

import pytest

from orchestrator.errors import UsageError
from orchestrator.outcome.states import JobState
from orchestrator.records.attempts import attempt_run_dir, keep_apart, with_attempt
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
    record = with_attempt(run, _record(hosts=("n1", "n2")), kept, next_one=True)
    assert (record.state, record.attempt) == (JobState.STARTING, 2)
    again = run.load()
    assert again.attempts == (kept,)  # job.json keeps it as it was
    assert attempt_run_dir(run, again, None) == (run, again)  # the latest: the job's own
    older_dir, older = attempt_run_dir(run, again, 1)
    assert older_dir.logs == run.path / "attempts" / "1" / "logs" and older.hosts == ("n1", "n2")
    with pytest.raises(UsageError, match="has no attempt 5"):
        attempt_run_dir(run, again, 5)

