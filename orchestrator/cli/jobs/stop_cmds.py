"""`orch stop`: stop a job from any terminal as its first Ctrl-C would: every rank gets the
stop signal and the job's grace to save and exit."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.app import app
from orchestrator.cli.documents import err_console
from orchestrator.cli.options import RUNS_DIR, examples
from orchestrator.cli.user_defaults import runs_dir_option
from orchestrator.records.job import runs_root
from orchestrator.records.rundir import find_job
from orchestrator.run.status import shown_state


@app.command(
    epilog=examples(
        "orch stop JOB",
    )
)
def stop(
    job: str = typer.Argument(..., help="The job id (or a unique prefix)."),
    runs_dir: Path = RUNS_DIR,
) -> None:
    """Stop a job so it can save (from any terminal).

    Every rank gets the stop signal (--stop-signal) and the grace (--stop-grace) to exit by
    itself; then the job is torn down. Waits for the job to end (its exit code is then
    143). `orch kill` stops at once.

    Exit codes: 0 the job ended; 1 it had ended already, has no head running it, or did not
    end while this waited (its grace and a minute); 2 a usage error."""
    from orchestrator.run.stop import request_stop  # imports SSH: paid by `orch stop` alone

    run = find_job(runs_root(runs_dir_option(runs_dir)), job)
    err = err_console()
    asked = request_stop(run, say=lambda text: err.print(text, markup=False))
    record = asked.record
    for line in record.stop.lines() if record.stop is not None else ():
        err.print(line, markup=False)
    err.print(f"job {record.id}: {shown_state(record)}")
    raise typer.Exit(0 if asked.ended else 1)
