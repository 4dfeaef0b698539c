"""`orch status` and `orch kill`: the jobs under the runs directory, one job's record, and
stopping a job at once from any terminal."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.cli.app import app
from orchestrator.cli.documents import err_console, print_document
from orchestrator.cli.jobs.record_shown import (
    environment_line,
    print_attempts,
    print_cause_notes,
    print_requeue,
    print_root_cause,
    record_document,
)
from orchestrator.cli.jobs.status_list import (
    COLUMNS,
    JobFilter,
    job_name,
    job_row,
    selected,
    unreadable_lines,
)
from orchestrator.cli.options import OUTPUT_PANEL, RUNS_DIR, examples, in_panel, one_of
from orchestrator.cli.user_defaults import runs_dir_option
from orchestrator.errors import UsageError
from orchestrator.outcome.states import JobState
from orchestrator.records.job import runs_root
from orchestrator.records.ownership import check_job, check_runs_root
from orchestrator.records.rundir import find_job, list_job_entries
from orchestrator.run.status import shown_state

_WHICH_PANEL = "Which jobs"


_STATE = typer.Option(
    None, "--state", help=f"Only jobs in this state, as the list shows it: {', '.join(JobState)}.",
    **{**one_of(JobState), "metavar": "STATE"}, rich_help_panel=_WHICH_PANEL,
)  # fmt: skip
_NAME = typer.Option(None, "--name", help="Only jobs of this name.", rich_help_panel=_WHICH_PANEL)
_LAST = typer.Option(None, "--last", min=1, metavar="N", help="Only the N most recent jobs.",
                     rich_help_panel=_WHICH_PANEL)  # fmt: skip
_STATUS_RUNS_DIR = in_panel(RUNS_DIR, OUTPUT_PANEL)
_STATUS_JSON = typer.Option(False, "--json", help="Print one JSON document.",
                            rich_help_panel=OUTPUT_PANEL)  # fmt: skip


def _check_state(state: str | None) -> None:
    """--state names a state a job can be in (Slurm's own, for a batch job that ended
    before orch started in it: slurm-<state>)."""
    if state is None or state in set(JobState) or state.startswith("slurm-"):
        return
    raise UsageError(f"--state {state!r} is no job state",
                     f"one of: {', '.join(JobState)}, or slurm-<Slurm's state>")  # fmt: skip


def _print_job_list(root: Path, wanted: JobFilter, as_json: bool) -> None:
    """Every job under root the filters keep, oldest first; unreadable records too, with why."""
    entries = selected(list_job_entries(root), wanted, shown_state)
    if as_json:
        docs = [record_document(e.record) for e in entries if e.record is not None]
        unreadable = [{"id": e.job_id, "problem": e.problem} for e in entries if e.record is None]
        print_document("jobs", {"runs_dir": str(root), "jobs": docs, "unreadable": unreadable})
        return
    table = Table(title=f"jobs in {root}")
    for column in COLUMNS:
        table.add_column(column, no_wrap=True)
    now = datetime.now(timezone.utc)
    for listed in entries:
        state = shown_state(listed.record) if listed.record is not None else ""
        table.add_row(*job_row(listed, state, now))
    # Piped output keeps whole ids and times rather than a terminal's 80 columns.
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    out.print(table)
    for line in unreadable_lines(entries):
        out.print(line, markup=False, soft_wrap=True)


@app.command(
    epilog=examples(
        "orch status",
        "orch status --state failed --last 5",
        "orch status --name cpu-smoke",
        "orch status JOB",
        "orch status JOB --json",
    )
)
def status(
    job: str = typer.Argument(None, help="A job id (or unique prefix); none: list the jobs."),
    state: str | None = _STATE,
    name: str | None = _NAME,
    last: int | None = _LAST,
    runs_dir: Path = _STATUS_RUNS_DIR,
    as_json: bool = _STATUS_JSON,
) -> None:
    """List jobs (id, name, script, state, hosts, duration, start in local time), or show one.

    One job: its state, nodes, exit codes, attempts and first failure.

    Exit codes: 0 shown (a list shows an unreadable record with why); 1 this job's record
    cannot be read; 2 a usage error."""
    root = runs_root(runs_dir_option(runs_dir))
    check_runs_root(root)  # before any record in it is read
    if job is None:
        _check_state(state)
        _print_job_list(root, JobFilter(state=state, name=name, last=last), as_json)
        return
    if state is not None or name is not None or last is not None:
        raise UsageError("--state, --name and --last choose among the jobs listed",
                         "leave out the job id to list the jobs")  # fmt: skip
    run = find_job(root, job)
    check_job(run)
    record = run.load()
    if as_json:
        print_document("job", record_document(record))
        return
    out = Console(highlight=False, soft_wrap=True)
    state = shown_state(record)
    gone = f" (head process {record.head_pid} is gone)" if state == JobState.HEAD_DIED else ""
    named = f" ({job_name(record)})" if job_name(record) else ""
    out.print(f"job {record.id}{named}: {state}{gone}", markup=False)
    out.print(f"launcher: {record.launcher}  started: {record.started_at}  "
              f"ended: {record.ended_at or '-'}  exit code: {record.exit_code}")  # fmt: skip
    out.print("command: " + " ".join(record.command), markup=False)
    if record.slurm_job_id:
        kind = "batch job" if record.slurm_batch else "allocation"
        step = f", step {record.slurm_step}" if record.slurm_step else ""
        out.print(f"slurm: {kind} {record.slurm_job_id}{step}; fan-out {record.fanout}")
    for node in record.hosts:
        code = record.node_exit_codes.get(node)
        out.print(f"  {node}: exit {'-' if code is None else code}")
    out.print(environment_line(record.environment), markup=False)
    print_attempts(out, record.attempts)
    for line in record.stop.lines() if record.stop is not None else ():
        out.print(line, markup=False)
    print_requeue(out, record.requeue)
    failure = record.first_failure
    if failure is not None and record.stop is None:
        print_root_cause(out, failure)
        rank = f" rank {failure.rank}" if failure.rank is not None else ""
        out.print(f"first failure: {failure.node}{rank}: {failure.reason}", markup=False)
        print_cause_notes(out, failure)
        for line in failure.last_lines if not failure.traceback else ():
            out.print(f"  | {line}", markup=False)


@app.command(epilog=examples("orch kill JOB", "orch kill JOB --grace 30"))
def kill(
    job: str = typer.Argument(..., help="The job id (or a unique prefix)."),
    runs_dir: Path = RUNS_DIR,
    grace: float = typer.Option(5.0, "--grace", help="Seconds between TERM and KILL."),
) -> None:
    """Stop a job on every node (from any terminal), by its job id.

    Exit codes: 0 every node stopped the job; 1 a node could not be reached or still runs
    some of it; 2 a usage error."""
    from orchestrator.run.teardown import kill_job  # SSH: only `orch kill` needs it

    run = find_job(runs_root(runs_dir_option(runs_dir)), job)
    err = err_console()
    outcome = kill_job(run, grace=grace, say=lambda text: err.print(text, markup=False))
    err.print(f"job {outcome.record.id}: {shown_state(outcome.record)}")
    raise typer.Exit(0 if outcome.ok else 1)
