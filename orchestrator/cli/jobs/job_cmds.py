"""`orch launch`, `orch submit`, `orch status`, `orch kill`: running jobs and their records."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.markup import escape

from orchestrator.cli.app import app
from orchestrator.cli.documents import err_console, print_document
from orchestrator.cli.jobs.job_options import JobOptions, job_request, with_job_options
from orchestrator.cli.jobs.job_printing import (
    PipelinePrinter,
    print_summary,
)
from orchestrator.cli.jobs.record_shown import record_document
from orchestrator.cli.options import examples
from orchestrator.cli.user_defaults import (
    read_defaults,
    say_defaults,
    with_defaults,
)
from orchestrator.errors import OrchError
from orchestrator.logs.view import make_view
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
from orchestrator.records.ownership import check_job
from orchestrator.records.rundir import find_job
from orchestrator.run.batch import submit_batch_job
from orchestrator.run.job import run_job
from orchestrator.run.plan_files import head_private_dir
from orchestrator.specs.options import launcher_named
from orchestrator.specs.recipe import load_recipe
from orchestrator.specs.recipe_model import Recipe
from orchestrator.specs.slurm import DEFAULT_MAX_REQUEUES

_RECIPE = typer.Argument(..., help="Recipe YAML (script, args, launcher, options).")
_SCRIPT_ARGS = typer.Argument(
    None, metavar="ARGS", help="More arguments for the script (after --)."
)
# Options end at the script: everything after it is the script's, and an option orch does
# not know, before it, is a usage error (not taken for the script).
_CONTEXT = {"allow_extra_args": True, "allow_interspersed_args": False}
_SBATCH_PANEL = "Slurm batch job (--sbatch)"


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
