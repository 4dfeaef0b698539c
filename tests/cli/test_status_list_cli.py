"""`orch status` with no job id lists the jobs: filtered by state, name and recency, each
with its name, state, hosts as a node set, duration and start in local time; a record that
cannot be read is listed with why, never hidden. Rows are tested on values, the list as
the user sees it."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from orchestrator.cli.jobs.status_list import (
    JobFilter,
    duration_text,
    job_duration,
    job_name,
    job_row,
    job_script,
    local_time,
    selected,
)
from orchestrator.records.job import JobRecord
from orchestrator.records.rundir import ListedJob, RunDir

HOSTS = ("gpu01", "gpu02", "gpu03", "gpu07")
UTC_PLUS_2 = timezone(timedelta(hours=2))


def _record(job_id: str, state: str = "succeeded", **changes: object) -> JobRecord:
    record = JobRecord(id=job_id, state=state, launcher="pdsh", command=("python", "x.py"),
                       hosts=HOSTS, workdir="/w", started_at="2026-11-24T01:02:03+00:00",
                       head_pid=0, head_start=None,
                       ended_at="2026-11-24T02:05:33+00:00")  # type: ignore[arg-type]  # fmt: skip
    return replace(record, **changes)  # type: ignore[arg-type]


def _state(record: JobRecord) -> str:
    return record.state


def test_a_record_written_before_jobs_had_names_loads_with_none():
    old = _record("j1").to_json()
    del old["name"]
    assert JobRecord.from_json(old).name is None
    assert JobRecord.from_json(_record("j2", name="smoke").to_json()).name == "smoke"


def test_a_jobs_name_is_its_own_else_its_recipes_file_name():
    assert job_name(_record("j", name="bert")) == "bert"
    assert job_name(_record("j", recipe="/r/cpu-smoke.yaml")) == "cpu-smoke"
    assert job_name(_record("j")) == ""


def test_the_filters_keep_the_state_name_and_the_most_recent_and_every_unreadable_one():
    entries = [ListedJob("a", _record("a", name="x")),
               ListedJob("b", _record("b", "failed", name="x")),
               ListedJob("c", None, "no job.json"),
               ListedJob("d", _record("d", "failed", name="y")),
               ListedJob("e", _record("e", "failed", name="x"))]  # fmt: skip

    def ids(wanted: JobFilter) -> list[str]:
        return [e.job_id for e in selected(entries, wanted, _state)]

    assert ids(JobFilter()) == ["a", "b", "c", "d", "e"]
    assert ids(JobFilter(state="failed")) == ["b", "c", "d", "e"]
    assert ids(JobFilter(state="failed", name="x")) == ["b", "c", "e"]
    assert ids(JobFilter(last=2)) == ["c", "d", "e"]
    assert ids(JobFilter(name="x", last=1)) == ["c", "e"]


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (45, "45s"), (200, "3m20s"),
                                               (7500, "2h05m"), (273600, "3d04h")])  # fmt: skip
def test_a_duration_reads_at_a_glance(seconds: int, text: str):
    assert duration_text(seconds) == text


def test_a_running_jobs_duration_runs_to_now_and_says_so():
    now = datetime(2026, 11, 24, 1, 12, 3, tzinfo=timezone.utc)
    assert job_duration(_record("j", "running", ended_at=None), now) == "10m00s+"
    assert job_duration(_record("j"), now) == "1h03m"


def test_a_row_folds_the_hosts_and_shows_the_start_in_local_time():
    now = datetime(2026, 11, 24, 3, 0, tzinfo=timezone.utc)
    record = _record("j", name="smoke", script="/w/train/x.py")
    row = job_row(ListedJob("j", record), "succeeded", now, UTC_PLUS_2)
    assert row == ("j", "smoke", "train/x.py", "succeeded", "gpu[01-03,07]", "1h03m",
                   "2026-11-24 03:02")  # fmt: skip
    assert local_time("2026-11-24T23:30:00+00:00", UTC_PLUS_2) == "2026-11-25 01:30"


def test_the_script_shows_as_the_user_gave_it_or_within_the_jobs_directory():
    assert job_script(_record("j", script="train.py")) == "train.py"
    assert job_script(_record("j", script="/w/recipes/scripts/cpu_smoke.py")) == (
        "recipes/scripts/cpu_smoke.py"
    )
    assert job_script(_record("j", script="/elsewhere/t.py")) == "/elsewhere/t.py"
    assert job_script(_record("j")) == ""  # a record from before scripts were kept


def _runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    RunDir(runs / "20261124-010203-aaaaaa").create().save(
        _record("20261124-010203-aaaaaa", name="smoke", script="smoke_train.py"))
    RunDir(runs / "20261124-020203-bbbbbb").create().save(
        _record("20261124-020203-bbbbbb", "failed", recipe="/r/cpu-smoke.yaml"))
    broken = RunDir(runs / "20261124-030203-cccccc").create()
    (broken.path / "job.json").write_text("{not json")
    RunDir(runs / "20261124-040203-dddddd").create()  # no job.json
    shared = RunDir(runs / "20261124-050203-eeeeee").create()
    shared.save(_record("20261124-050203-eeeeee"))
    os.chmod(shared.path / "job.json", 0o666)  # anyone may write it: not trusted
    return runs


def _line_of(text: str, job_id: str) -> str:
    [line] = [line for line in text.splitlines() if line.startswith(f"│ {job_id}")]
    return line


def test_the_list_shows_each_job_and_says_why_one_cannot_be_read(tmp_path, orch_here):
    result = orch_here(["status"], _runs(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    header = out.splitlines()[2].split()
    assert [w for w in header if w != "┃"] == ["job", "name", "script", "state", "hosts",
                                               "duration", "started"]  # fmt: skip
    smoke = _line_of(out, "20261124-010203-aaaaaa")
    assert "smoke" in smoke and "smoke_train.py" in smoke and "succeeded" in smoke
    assert "gpu[01-03,07]" in smoke
    assert "1h03m" in smoke
    assert "cpu-smoke" in _line_of(out, "20261124-020203-bbbbbb")
    for job_id in ("20261124-030203-cccccc", "20261124-040203-dddddd", "20261124-050203-eeeeee"):
        assert "unreadable" in _line_of(out, job_id)
    assert "20261124-030203-cccccc: unreadable: " in out and "unreadable job record" in out
    assert "20261124-040203-dddddd: unreadable: no job.json" in out
    assert "20261124-050203-eeeeee: unreadable: " in out and "writable" in out


def test_the_list_filters_by_state_name_and_recency(tmp_path, orch_here):
    runs = _runs(tmp_path)
    failed = orch_here(["status", "--state", "failed"], runs).stdout
    assert "20261124-020203-bbbbbb" in failed and "│ 20261124-010203-aaaaaa" not in failed
    named = orch_here(["status", "--name", "smoke"], runs).stdout
    assert "│ 20261124-010203-aaaaaa" in named and "│ 20261124-020203-bbbbbb" not in named
    last = json.loads(orch_here(["status", "--last", "1", "--json"], runs).stdout)
    assert [job["id"] for job in last["jobs"]] == ["20261124-020203-bbbbbb"]
    assert [u["id"] for u in last["unreadable"]] == ["20261124-030203-cccccc",
                                                     "20261124-040203-dddddd",
                                                     "20261124-050203-eeeeee"]  # fmt: skip


def test_a_state_that_is_none_is_refused_with_the_states_there_are(tmp_path, orch_here):
    result = orch_here(["status", "--state", "done"], _runs(tmp_path))
    assert result.returncode == 2
    assert "--state 'done' is no job state" in result.stderr
    assert "succeeded, failed" in result.stderr


def test_the_filters_go_with_the_list_not_one_job(tmp_path, orch_here):
    result = orch_here(["status", "20261124-010203-aaaaaa", "--last", "1"], _runs(tmp_path))
    assert result.returncode == 2
    assert "leave out the job id" in result.stderr


def test_one_unreadable_job_says_why(tmp_path, orch_here):
    result = orch_here(["status", "20261124-030203"], _runs(tmp_path))
    assert result.returncode == 1
    assert "20261124-030203-cccccc/job.json: unreadable job record" in result.stderr


def test_one_job_is_shown_with_its_name(tmp_path, orch_here):
    result = orch_here(["status", "20261124-010203"], _runs(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("job 20261124-010203-aaaaaa (smoke): succeeded")
