"""`orch report JOB`: the job's one page, runs/<job>/report.html, written again from its
directory (every job writes it when it ends: cli/jobs/job_cmds.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.app import app
from orchestrator.cli.options import RUNS_DIR, examples
from orchestrator.cli.user_defaults import runs_dir_option
from orchestrator.records.job import runs_root
from orchestrator.records.ownership import check_job, check_runs_root
from orchestrator.records.rundir import find_job
from orchestrator.report import write_report


@app.command(
    epilog=examples(
        "orch report",
        "orch report 20261121-232700-9f3a1c",
    )
)
def report(
    job: str = typer.Argument(None, help="A job id (or unique prefix); none: the newest job."),
    runs_dir: Path = RUNS_DIR,
) -> None:
    """Write the job's report and print its path.

    runs/<job>/report.html: one self-contained page, readable offline.

    Exit codes: 0 written; 1 the record cannot be read; 2 a usage error."""
    root = runs_root(runs_dir_option(runs_dir))
    check_runs_root(root)  # before any record in it is read
    run = find_job(root, job)
    check_job(run)
    typer.echo(str(write_report(run.path)))
