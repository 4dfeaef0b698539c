"""`orch report JOB`, and the report every job's end writes: through orch's entry point."""

from __future__ import annotations

import pytest
from _report_job import JOB, failed_job

from orchestrator.cli.jobs import job_printing
from orchestrator.outcome.states import JobState
from orchestrator.run.launch import LaunchResult


def test_orch_report_writes_the_page_and_prints_its_path(tmp_path, orch_here):
    runs = tmp_path / "runs"
    run = failed_job(runs)
    result = orch_here(["report", JOB[:8], "--runs-dir", str(runs)], runs)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(run.path / "report.html")
    assert "rank 5" in (run.path / "report.html").read_text()


def test_orch_report_refuses_a_runs_directory_others_can_write(tmp_path, orch_here):
    runs = tmp_path / "runs"
    failed_job(runs)
    runs.chmod(0o777)
    result = orch_here(["report", JOB, "--runs-dir", str(runs)], runs)
    assert result.returncode == 1
    assert "writable" in result.stderr or "others" in result.stderr, result.stderr
    assert not (runs / JOB / "report.html").exists()


def _result(run_dir) -> LaunchResult:
    return LaunchResult(
        job_id=JOB, run_dir=run_dir, state=JobState.FAILED, exit_code=1,
        node_exit_codes={"n1": 143, "n2": 1}, first_failure=None, teardown=None,
        node_logs={"n1": "ok", "n2": "ok"},
    )  # fmt: skip


def test_a_job_s_end_writes_its_report_and_names_it(tmp_path, capsys):
    run = failed_job(tmp_path)
    job_printing.print_summary(_result(run.path))
    err = capsys.readouterr().err
    assert f"report: {run.path / 'report.html'}" in err
    assert (run.path / "report.html").is_file()


@pytest.mark.parametrize("broken", ["no record", "a directory in its place"])
def test_a_report_that_cannot_be_written_is_one_line(tmp_path, capsys, broken):
    run = failed_job(tmp_path)
    if broken == "no record":
        run.job_file.unlink()
    else:
        (run.path / "report.html").mkdir()
    job_printing.print_summary(_result(run.path))  # returns: the job's exit code is untouched
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("report")]
    assert len(lines) == 1 and lines[0].startswith("report not written: "), err
    assert "Traceback" not in err
    assert not (run.path / ".report.html.tmp").exists()


@pytest.mark.parametrize("problem", [KeyError("ranks"), RuntimeError(), RecursionError("deep")])
def test_a_report_that_fails_unexpectedly_is_still_one_line(tmp_path, capsys, monkeypatch,
                                                             problem):  # fmt: skip
    """Whatever breaks in the page (a bug, a record no version of it foresaw), the job's end
    stands: one line, no traceback, and the summary returns."""
    run = failed_job(tmp_path)

    def broken(_run_dir):
        raise problem

    monkeypatch.setattr(job_printing, "write_report", broken)
    job_printing.print_summary(_result(run.path))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("report")]
    assert len(lines) == 1 and lines[0].startswith("report not written: "), err
    assert "Traceback" not in err
