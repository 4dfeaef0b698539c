"""Job records on disk: round trip, lookup, and a running job whose head is gone."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace

import pytest

from orchestrator.errors import UsageError
from orchestrator.outcome.rank_ends import Role
from orchestrator.outcome.states import FailureKind, JobState
from orchestrator.records.job import FirstFailure, JobRecord, RankRecord, process_start_time
from orchestrator.records.rundir import RunDir, find_job, list_jobs, run_dir
from orchestrator.run.status import shown_state
from orchestrator.specs.words import Fanout


def _record(job_id: str, **kw) -> JobRecord:
    base = dict(id=job_id, state="running", launcher="torchrun", command=("python", "x.py"),
                hosts=("n1", "n2"), workdir="/w", started_at="2026-01-01T00:00:00+00:00",
                head_pid=os.getpid(), head_start=process_start_time(os.getpid()))  # fmt: skip
    base.update(kw)
    return JobRecord(**base)


def test_round_trip_keeps_every_field(tmp_path):
    failure = FirstFailure("n2", 3, 7, "exited with code 7", ("a", "b"))
    record = _record("j1", state="failed", exit_code=7, first_failure=failure,
                     node_exit_codes={"n1": 143, "n2": 7}, node_logs={"n1": "ok"})  # fmt: skip
    run = RunDir(tmp_path / "j1").create()
    run.save(record)
    assert run.load() == record


def test_job_json_holds_states_and_kinds_as_the_plain_words_they_always_were(tmp_path):
    failure = FirstFailure("n2", None, 1, "lost its ssh connection", kind=FailureKind.LOST)
    record = _record("j1", state=JobState.FAILED, first_failure=failure)
    run = RunDir(tmp_path / "j1").create()
    run.save(record)
    written = run.job_file.read_text()
    as_words = replace(record, state="failed", first_failure=replace(failure, kind="lost"))
    assert written == json.dumps(as_words.to_json(), indent=2) + "\n"
    assert '"state": "failed"' in written and '"kind": "lost"' in written
    loaded = run.load()
    assert loaded.state is JobState.FAILED and loaded.first_failure.kind is FailureKind.LOST
    shown = f"job {loaded.id}: {loaded.state} ({loaded.first_failure.kind})"
    assert shown == "job j1: failed (lost)"


def test_job_json_holds_roles_and_the_fan_out_as_words_and_reads_them_back_as_members(tmp_path):
    rank = RankRecord(node="n1", rank=0, local_rank=0, pid=9, start=1.0, end=2.0, exit_code=7,
                      signal=None, role=Role.CAUSE)  # fmt: skip
    record = _record("j1", state=JobState.FAILED, ranks=(rank,), fanout=Fanout.SRUN)
    run = RunDir(tmp_path / "j1").create()
    run.save(record)
    written = json.loads(run.job_file.read_text())
    assert (written["fanout"], written["ranks"][0]["role"]) == ("srun", "cause")
    loaded = run.load()
    assert loaded == record
    assert loaded.fanout is Fanout.SRUN and loaded.ranks[0].role is Role.CAUSE
    written["fanout"] = None  # a record from before the fan-out was kept: pdsh
    run.job_file.write_text(json.dumps(written))
    assert run.load().fanout is Fanout.PDSH


@pytest.mark.process
def test_running_job_with_a_live_head_is_running_and_a_dead_head_is_shown(tmp_path):
    assert shown_state(_record("j1")) == "running"
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert shown_state(_record("j2", head_pid=gone.pid, head_start="1")) == "head-died"
    # A finished job stays what it was, whatever became of its head.
    assert shown_state(_record("j3", state="killed", head_pid=gone.pid)) == "killed"


def test_find_job_by_id_prefix_or_newest(tmp_path):
    for job_id in ("20260101-000000-aaaaaa", "20260102-000000-bbbbbb"):
        RunDir(tmp_path / job_id).create().save(_record(job_id))
    assert [r.id for r in list_jobs(tmp_path)] == ["20260101-000000-aaaaaa",
                                                   "20260102-000000-bbbbbb"]  # fmt: skip
    assert find_job(tmp_path, None).path.name == "20260102-000000-bbbbbb"
    assert find_job(tmp_path, "20260101").path.name == "20260101-000000-aaaaaa"
    with pytest.raises(UsageError, match="2 jobs"):
        find_job(tmp_path, "2026")
    with pytest.raises(UsageError, match="no jobs recorded"):
        find_job(tmp_path / "empty", None)


def test_a_jobs_directory_is_its_users_alone_whatever_the_umask(tmp_path):
    old = os.umask(0o002)  # a cluster's usual umask for shared project groups
    try:
        run = run_dir(tmp_path / "runs", "job-1").create()
    finally:
        os.umask(old)
    assert run.path.stat().st_mode & 0o777 == 0o700
    assert run.logs.is_dir()
    run.path.chmod(0o755)  # created again (a record that exists): made private again
    assert run.create().path.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("exit_code", "kind", "whose"),
    [(0, None, "job"), (7, FailureKind.RANK, "job"), (1, FailureKind.HEAD, "launcher"),
     (1, FailureKind.LOST, "orch"), (124, FailureKind.HANG, "orch"),
     (143, FailureKind.STOPPED, "orch"), (None, None, None)],
)  # fmt: skip
def test_job_json_says_whose_exit_code_the_jobs_is(tmp_path, exit_code, kind, whose):
    failure = FirstFailure("n2", 3, exit_code or 1, "why", kind=kind) if kind else None
    record = _record("j1", state="failed", exit_code=exit_code, first_failure=failure)
    run = RunDir(tmp_path / "j1").create()
    run.save(record)
    assert json.loads(run.job_file.read_text())["exit_code_from"] == whose
