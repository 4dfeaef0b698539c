"""`orch launch`, `orch submit`, `orch status`, `orch kill`: running jobs and their records."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.cli.app import app
from orchestrator.cli.documents import print_document
from orchestrator.cli.jobs.job_options import RUNS_DIR, JobOptions, job_request, with_job_options
from orchestrator.cli.jobs.job_printing import (
    PipelinePrinter,
    err_console,
    print_attempts,
    print_cause_notes,
    print_requeue,
    print_root_cause,
    print_summary,
)
from orchestrator.cli.jobs.status_list import (
    COLUMNS,
    JobFilter,
    job_name,
    job_row,
    selected,
    unreadable_lines,
)
from orchestrator.cli.options import OUTPUT_PANEL, examples, in_panel, one_of
from orchestrator.cli.user_defaults import (
    read_defaults,
    runs_dir_option,
    say_defaults,
    with_defaults,
)
from orchestrator.errors import OrchError, UsageError
from orchestrator.logs.view import make_view
from orchestrator.outcome.states import JobState
from orchestrator.plan.describe import command_files, dry_run_document, plan_text
from orchestrator.plan.dry_checks import dry_run_exit_code, dry_run_findings
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.plan.request import (
    JobRequest,
    LaunchOverrides,
    RequeueRequest,
    SbatchRequest,
    check_requeue,
    launch_spec,
    recipe_spec,
)
from orchestrator.prepare.dry_run import commands_dir, head_facts, write_command_files
from orchestrator.prepare.job import prepare_job
from orchestrator.records.job import (
    EnvironmentRecord,
    JobRecord,
    runs_root,
)
from orchestrator.records.ownership import check_job, check_runs_root
from orchestrator.records.rundir import find_job, list_job_entries
from orchestrator.run.batch import submit_batch_job
from orchestrator.run.job import run_job
from orchestrator.run.plan_files import head_private_dir
from orchestrator.run.status import shown_state
from orchestrator.run.teardown import kill_job
from orchestrator.specs.inventory import nodes_text
from orchestrator.specs.options import launcher_named
from orchestrator.specs.recipe import load_recipe
from orchestrator.specs.recipe_model import Recipe
from orchestrator.specs.slurm import DEFAULT_MAX_REQUEUES
from orchestrator.specs.units import format_bytes

_RECIPE = typer.Argument(..., help="Recipe YAML (script, args, launcher, options).")
_SCRIPT_ARGS = typer.Argument(
    None, metavar="ARGS", help="More arguments for the script (after --)."
)
# Options end at the script: everything after it is the script's, and an option orch does
# not know, before it, is a usage error (not taken for the script).
_CONTEXT = {"allow_extra_args": True, "allow_interspersed_args": False}
_SBATCH_PANEL = "Slurm batch job (--sbatch)"
_WHICH_PANEL = "Which jobs"


def _print_dry_run(plan: LaunchPlan, *, as_json: bool) -> None:
    """The plan on stdout, what the dry run found on the head on stderr; the exit code the
    real launch would stop with before starting anything (0: it would start)."""
    findings = dry_run_findings(plan, head_facts(plan))
    if as_json:
        print_document("plan", dry_run_document(plan, findings))
    else:
        directory = commands_dir(plan.job_id)
        write_command_files(directory, command_files(plan))
        typer.echo(plan_text(plan, directory), nl=False)
    err = err_console()
    for finding in findings:
        level = "[red]error[/]" if finding.is_error else "[yellow]warning[/]"
        err.print(f"{level}: {escape(finding.problem)}\n  fix: {escape(finding.fix)}")
    code = dry_run_exit_code(findings)
    if code:
        raise typer.Exit(code)


def _print_final_record(runs: Path, job_id: str) -> None:
    """`launch --json`: the job's record as `orch status JOB --json` prints it, on stdout.
    A record that cannot be read then is said on stderr: the job's exit code stands."""
    try:
        run = find_job(runs, job_id)
        check_job(run)
        document = record_document(run.load())
    except OrchError as err:
        err_console().print(f"error: the job's record: {err.message}", markup=False)
        return
    print_document("job", document)


def _execute(request: JobRequest, *, dry_run: bool, as_json: bool, quiet: bool) -> None:
    job = prepare_job(request, os.environ, private_dir=head_private_dir, dry_run=dry_run,
                      say=lambda text: err_console().print(text, markup=False))  # fmt: skip
    if dry_run:
        _print_dry_run(job.plan, as_json=as_json)
        return
    # With --json, stdout holds the record alone: the job's output shows on stderr.
    view = None if quiet else make_view(job.plan.hosts, to_stderr=as_json)
    try:
        result = run_job(job, view=view, reporter=PipelinePrinter(view))
    finally:
        if view is not None:
            view.close()
    print_summary(result, restarts=request.max_restarts > 0)
    if as_json:
        _print_final_record(result.run_dir.parent, result.job_id)
    raise typer.Exit(result.exit_code)


def _defaulted(options: JobOptions, recipe: Recipe | None = None, *,
               sbatch: bool = False) -> JobOptions:  # fmt: skip
    """The options with the defaults (ORCH_HOSTFILE, orch.toml, ~/.config/orch/config.toml)
    where neither they nor the recipe say; each default used is said, with its source."""
    options, said = with_defaults(options, read_defaults(), recipe, sbatch=sbatch)
    say_defaults(said)
    return options


def _script_args(extra: list[str]) -> list[str]:
    """What follows the script. A `--` right after it only separates (`train.py -- --lr 1`),
    as it always has; any later `--` is the script's own."""
    return extra[1:] if extra[:1] == ["--"] else list(extra)


@app.command(
    context_settings=_CONTEXT,
    epilog=examples(
        "orch launch -H hostfile train.py --lr 3e-4",
        "orch launch -w 'gpu[01-04]' --nproc-per-node 8 -l torchrun train.py",
        "# 4 nodes; the rest of the hostfile are spares for up to 3 restarts",
        "orch launch -H hostfile -N 4 --max-restarts 3 train.py",
        "# every file and command line, nothing run",
        "orch launch -H hostfile --dry-run train.py",
    ),
)
@with_job_options
def launch(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script (then its arguments)."),
    *,
    options: JobOptions,
) -> None:
    """Run SCRIPT [ARGS...] on every node of the hostfile, or of -w.

    Everything after SCRIPT is the script's own (a `--` right after it only separates).

    Exit codes: the job's own (0 when every rank succeeded); 124 a hang or a time limit;
    130 Ctrl-C; 143 `orch stop`, Slurm or `orch kill`; nothing started: 69 the nodes, 73
    the record, 78 the pre-flight; 2 a usage error."""
    options = _defaulted(options)
    spec = launch_spec(script, _script_args(ctx.args), launcher=options.launcher or "pdsh",
                       env=options.env, environ=os.environ,
                       nproc_per_node=options.nproc_per_node, python=options.python,
                       workdir=options.workdir, main_port=options.main_port)  # fmt: skip
    request = job_request(options, spec, nodes=options.nodes)
    _execute(request, dry_run=options.dry_run, as_json=options.as_json, quiet=options.quiet)


@app.command(
    epilog=examples(
        "orch submit recipes/cpu-smoke.yaml -H hostfile",
        "# the recipe's script with more arguments, on 2 nodes of the hostfile",
        "orch submit recipes/cpu-smoke.yaml -H hostfile -N 2 -- --steps 100",
        "# a Slurm batch job: this submit runs inside its new allocation",
        "orch submit recipes/cpu-smoke-slurm.yaml --sbatch -N 2 --time 1:00:00",
        "# stopped at its time limit, it saves and goes on in the next allocation",
        "orch submit recipes/cpu-resume.yaml --sbatch --time 4:00:00 --requeue",
    )
)
@with_job_options
def submit(
    recipe: Path = _RECIPE,
    *,
    options: JobOptions,
    sbatch: bool = typer.Option(
        False,
        "--sbatch",
        help="Submit to Slurm: a batch job that runs this submit inside a "
        "new allocation (--dry-run shows the script); `orch status`/`kill` follow it.",
        rich_help_panel=_SBATCH_PANEL,
    ),
    gpus_per_node: int | None = typer.Option(
        None,
        "--gpus-per-node",
        min=1,
        help="--sbatch: GPUs per node to ask for.",
        rich_help_panel=_SBATCH_PANEL,
    ),
    time_limit: str | None = typer.Option(
        None, "--time", help="--sbatch: Slurm's time limit.", rich_help_panel=_SBATCH_PANEL
    ),
    partition: str | None = typer.Option(
        None, "--partition", help="--sbatch: the partition.", rich_help_panel=_SBATCH_PANEL
    ),
    requeue: bool = typer.Option(
        False,
        "--requeue",
        help="--sbatch: stopped for its time limit or a preemption, the job is requeued and "
        "goes on in a new allocation under the same job id (ORCH_RESTART_COUNT counts on). "
        "Not when it ends by itself, fails, or the user stops it.",
        rich_help_panel=_SBATCH_PANEL,
    ),
    max_requeues: int | None = typer.Option(
        None,
        "--max-requeues",
        min=0,
        metavar="N",
        help=f"--requeue: at most N requeues (default {DEFAULT_MAX_REQUEUES}).",
        rich_help_panel=_SBATCH_PANEL,
    ),
    given_job_id: str | None = typer.Option(None, "--job-id", hidden=True),
    script_args: list[str] = _SCRIPT_ARGS,
) -> None:
    """Run a recipe: everything the launch needs, in one file.

    Launch's options given here win over the recipe's values; ARGS go to the script.

    Exit codes: as `orch launch`'s; with --sbatch, 0 once Slurm took the job."""
    asked_requeue = RequeueRequest(requeue, max_requeues)
    check_requeue(asked_requeue, sbatch=sbatch, batch_run=given_job_id is not None)
    loaded = load_recipe(recipe)
    options = _defaulted(options, loaded, sbatch=sbatch)
    extra = tuple(script_args or ())
    launcher = launcher_named(options.launcher) if options.launcher else None
    given = LaunchOverrides(launcher=launcher, nproc_per_node=options.nproc_per_node,
                            python=options.python, workdir=options.workdir,
                            env=tuple(options.env))  # fmt: skip
    spec = recipe_spec(loaded, str(recipe), extra_args=extra, main_port=options.main_port,
                       overrides=given, environ=os.environ)  # fmt: skip
    asked = SbatchRequest(gpus_per_node, time_limit, partition) if sbatch else None
    nodes = options.nodes or loaded.recovery.nodes or loaded.slurm.nodes
    request = job_request(options, spec, nodes=nodes,
                          recipe=loaded, extra_args=extra, sbatch=asked,
                          job_id=given_job_id, overrides=given,
                          requeue=asked_requeue)  # fmt: skip
    if request.sbatch is None:
        _execute(request, dry_run=options.dry_run, as_json=options.as_json, quiet=options.quiet)
        return
    batch = submit_batch_job(request, dry_run=options.dry_run)
    if batch.slurm_job is None:
        typer.echo(batch.script, nl=False)
        return
    err_console().print(
        f"job {batch.job_id}: submitted as Slurm job {batch.slurm_job} ({batch.nodes} nodes); "
        f"`orch status {batch.job_id}`; its output: {batch.output}"
    )
    if options.as_json:  # the job's record as it stands: queued
        _print_final_record(Path(batch.output).parent.parent, batch.job_id)
        return
    typer.echo(batch.job_id)


def record_document(record: JobRecord) -> dict:
    """The job's record as `--json` prints it (`orch status JOB --json`, `orch launch
    --json`): job.json, with the state as `orch status` shows it."""
    doc = record.to_json()
    doc["recorded_state"] = record.state
    doc["state"] = shown_state(record)
    return doc


def environment_line(kept: EnvironmentRecord | None) -> str:
    """`environment: 1a2b3c4d on every node, the head's; pushed to n2 (3.0 MiB)`: what the
    job's nodes ran, by fingerprint (the first 8 characters)."""
    if kept is None:
        return "environment: not looked at (no pre-flight)"
    groups: dict[str | None, list[str]] = {}
    for node, fingerprint in kept.nodes.items():
        groups.setdefault(fingerprint, []).append(node)
    if len(groups) == 1:
        [(only, _)] = groups.items()
        parts = [f"{(only or 'unknown')[:8]} on every node"]
    else:
        parts = [f"{(p or 'unknown')[:8]} on {nodes_text(n)}" for p, n in groups.items()]
    if kept.reference is not None:
        same = set(groups) == {kept.reference}
        parts.append("the head's" if same else f"the head's is {kept.reference[:8]}")
    text = "environment: " + ", ".join(parts)
    if kept.pushed:
        text += f"; pushed to {nodes_text(kept.pushed)} ({format_bytes(kept.pushed_bytes)})"
    return text


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
    run = find_job(runs_root(runs_dir_option(runs_dir)), job)
    err = err_console()
    outcome = kill_job(run, grace=grace, say=lambda text: err.print(text, markup=False))
    err.print(f"job {outcome.record.id}: {shown_state(outcome.record)}")
    raise typer.Exit(0 if outcome.ok else 1)
