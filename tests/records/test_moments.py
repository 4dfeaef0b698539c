"""A job's moments (records/moments.py): kept as JSON lines, read back in time order, private."""

from __future__ import annotations

import json

from orchestrator.records.job import MOMENTS_FILE, PREFLIGHT_FILE
from orchestrator.records.moments import (
    Moment,
    MomentKind,
    append_moments,
    note_attempt,
    read_moments,
    save_preflight,
)
from orchestrator.records.rundir import RunDir


def test_moments_are_read_back_in_time_order(tmp_path):
    append_moments(RunDir(tmp_path), [Moment(5.0, MomentKind.END, detail="failed")])
    append_moments(RunDir(tmp_path), [Moment(2.0, MomentKind.FIRST_OUTPUT, "n1", 3),
                                      Moment(1.0, MomentKind.START)])  # fmt: skip
    assert read_moments(tmp_path) == (
        Moment(1.0, "start"), Moment(2.0, "first-output", "n1", 3),
        Moment(5.0, "end", detail="failed"),
    )  # fmt: skip
    assert (tmp_path / MOMENTS_FILE).stat().st_mode & 0o777 == 0o600


def test_a_line_cut_short_is_skipped_and_no_file_is_no_moment(tmp_path):
    assert read_moments(tmp_path) == ()
    (tmp_path / MOMENTS_FILE).write_text('{"t": 1, "kind": "start"}\n{"t": 2, "ki\n{"kind": 3}\n')
    assert read_moments(tmp_path) == (Moment(1.0, "start"),)


def test_a_moment_that_cannot_be_written_never_fails_the_job(tmp_path):
    append_moments(RunDir(tmp_path / "gone"), [Moment(1.0, MomentKind.START)])  # no such directory
    assert not (tmp_path / "gone").exists()


def test_a_restart_loop_notes_each_attempt(tmp_path):
    note_attempt(RunDir(tmp_path), 12.5, 2, "n3 stopped answering")
    assert read_moments(tmp_path) == (
        Moment(12.5, "attempt", detail="attempt 2: n3 stopped answering"),
    )


def test_the_preflight_is_kept_once_the_run_directory_exists(tmp_path):
    save_preflight(RunDir(tmp_path), 1.0, 3.5, {"ok": True, "parity": []})
    assert json.loads((tmp_path / PREFLIGHT_FILE).read_text()) == {"ok": True, "parity": []}
    assert (tmp_path / PREFLIGHT_FILE).stat().st_mode & 0o777 == 0o600
    assert [m.kind for m in read_moments(tmp_path)] == ["preflight-start", "preflight-end"]
