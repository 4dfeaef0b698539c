"""`orch launch`, `orch submit`, `orch status`, `orch kill`: running jobs and their records."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.checks.model import DoctorReport
from orchestrator.cli.app import app
from orchestrator.cli.options import EXCLUDE, INCLUDE, SLURM
from orchestrator.errors import UsageError
from orchestrator.logs.view import LiveView, PlainView, make_view
from orchestrator.pernode import GroupResult
from orchestrator.plan.describe import plan_summary, plan_text
from orchestrator.plan.launch_plan import LaunchPlan, build_plan, plan_from_recipe
from orchestrator.plan.sbatch_script import (
    OUTPUT_NAME,
    SCRIPT_NAME,
    batch_request,
    render_batch_script,
)
from orchestrator.run.launch import LaunchResult
from orchestrator.run.pipeline import PipelineOptions, execute_plan, head_context
from orchestrator.run.ports import plan_with_main_port
from orchestrator.run.records import (
    FINAL_STATES,
    FirstFailure,
    JobRecord,
    RunDir,
    find_job,
    finished,
    head_alive,
    list_jobs,
    new_job_id,
    now_iso,
    run_dir,
    runs_root,
    shown_state,
)
from orchestrator.run.slurm import ACTIVE_STATES, cancel, job_state, submit_batch
from orchestrator.run.sync import SyncedFiles
from orchestrator.run.teardown import KILL_MARKER, teardown_job
from orchestrator.run.verdict import HANG_EXIT_CODE, JobState, WatchSettings
from orchestrator.specs.inventory import filter_hosts, read_hostfile
from orchestrator.specs.options import check_launcher
from orchestrator.specs.recipe import Recipe
from orchestrator.specs.slurm import JOB_ID_VAR, allocation_from_env, chosen_fanout, job_inventory
from orchestrator.stacks.fold import StackBlock, rank_ranges, user_frame

_RUNS_DIR = typer.Option(
    None, "--runs-dir", help="Job records (default: $ORCH_RUNS_DIR or ./runs)."
)
_HOSTFILE = typer.Option(None, "--hostfile", "-H", help="DeepSpeed hostfile.")
_ENV = typer.Option(
    [], "--env", "-e", help="NAME=VALUE for every rank; NAME alone forwards the head's value."
)
_RECIPE = typer.Argument(..., help="Recipe YAML (script, args, launcher, options).")
_KEEP_REMOTE_LOGS = typer.Option(
    False,
    "--keep-remote-logs",
    help="Leave each node's raw logs in /tmp/orch-runs/<job>/ after pulling them back.",
)
_SYNC = typer.Option(
    False, "--sync", help="Copy the working directory to every node first (no shared FS)."
)
_DRY_RUN = typer.Option(
    False, "--dry-run", help="Print the plan (every file and command line), run nothing."
)
_AS_JSON = typer.Option(False, "--json", help="With --dry-run: the plan as one JSON document.")
_NO_DOCTOR = typer.Option(False, "--no-doctor", help="Skip the pre-flight checks.")
_QUIET = typer.Option(False, "--quiet", "-q", help="Do not echo the job's output.")
_HEARTBEAT_TIMEOUT = typer.Option(
    WatchSettings.heartbeat_timeout,
    "--heartbeat-timeout",
    help="Seconds of silence after which a node has failed.",
)
_HANG_TIMEOUT = typer.Option(
    None,
    "--hang-timeout",
    min=1.0,
    help="Seconds without any output from any rank after which the job hung: every rank's "
    f"stack is taken, the job torn down, exit code {HANG_EXIT_CODE}. Off unless given.",
)
_MAIN_PORT = typer.Option(
    None,
    "--main-port",
    help="Rendezvous port on node 0 (default: a recipe's, else one orch finds free there).",
)
_FANOUT = typer.Option(
    None,
    "--fanout",
    help="What starts every node: pdsh (over ssh), or srun (one Slurm step; the default "
    "inside an allocation for the standard and torchrun launchers).",
)
_NODES = typer.Option(
    None,
    "--nodes",
    min=1,
    help="Nodes: inside an allocation, its first N (more than it holds "
    "is refused); with --sbatch, how many to ask Slurm for.",
)
_SCRIPT_ARGS = typer.Argument(None, help="More arguments for the script (after --).")
# Options end at the script: everything after it is the script's, and an option orch does
# not know, before it, is a usage error (not taken for the script).
_CONTEXT = {"allow_extra_args": True, "allow_interspersed_args": False}


def _err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _view(plan: LaunchPlan, quiet: bool) -> LiveView | PlainView | None:
    return None if quiet else make_view(plan.hosts)


def _parse_env(pairs: list[str]) -> tuple[dict[str, str], list[str]]:
    """(values set, names forwarded): --env NAME=VALUE sets NAME; --env NAME forwards the
    head's value of NAME (kept out of records and logs as a secret)."""
    env: dict[str, str] = {}
    forwarded: list[str] = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not name:
            raise UsageError(f"--env {pair!r} names no variable", "e.g. --env NCCL_DEBUG=INFO")
        if not sep:
            if name not in os.environ:
                raise UsageError(
                    f"--env {name}: {name} is not set on the head, so there is no value to "
                    "forward",
                    f"set it (export {name}=...) or give one: --env {name}=VALUE",
                )
            forwarded.append(name)
            continue
        env[name] = value
    return env, forwarded


def _majority_place(block: StackBlock) -> str:
    """Where most ranks stood: their innermost frame of the user's code, and the call
    they were inside (the collective they waited in)."""
    plural = "ranks" if len(block.ranks) > 1 else "rank"
    ranks = f"{plural} {rank_ranges(block.rank_numbers)}"
    frame = user_frame(block.ranks[0])
    inner = block.threads[0].frames[0].function if block.threads and block.threads[0].frames else ""
    where = frame.where if frame else "(no frame of your code)"
    inside = f", inside {inner}" if inner and (frame is None or inner != frame.function) else ""
    together = " stood together" if len(block.ranks) > 1 else " stood"
    return f"{ranks}{together} at {where}{inside}"


def _print_stacks_kept(result: LaunchResult) -> None:
    """Where the ranks still running stood when the job was torn down."""
    err = _err()
    if result.stacks_problem is not None:
        err.print(f"[yellow]{escape(result.stacks_problem)}[/]")
    if result.stacks_file is None or result.stacks is None:
        return
    folded = result.stacks.folded
    if not result.stacks.ranks:
        err.print("no rank was still running when the job was torn down")
        return
    err.print("where the ranks still running stood before the teardown:")
    for outlier in folded.outliers if folded is not None else ():
        where = outlier.frame.where if outlier.frame else "(no frame of your code)"
        err.print(f"  rank {outlier.rank} on {outlier.node} stood apart at {where}", markup=False)
    if folded is not None and folded.majority is not None:
        err.print(f"  {_majority_place(folded.majority)}", markup=False)
    err.print(f"every running rank's stack: {result.stacks_file}", markup=False)


def _print_root_cause(console: Console, failure: FirstFailure) -> None:
    """The failing rank's own traceback, first: the cascades on other ranks come after."""
    if not failure.traceback:
        return
    where = f"{failure.root_cause_node or '?'} rank {failure.root_cause_rank}"
    console.print(f"[bold]root cause[/]: {escape(where)}: {escape(failure.root_cause or '')}")
    for line in failure.traceback:
        console.print(f"  | {line}", markup=False, highlight=False)


def _print_summary(result: LaunchResult) -> None:
    err = _err()
    codes = ", ".join(
        f"{node}={'-' if code is None else code}" for node, code in result.node_exit_codes.items()
    )
    if result.state == JobState.SUCCEEDED:
        err.print(f"[green]job {result.job_id} succeeded[/] (nodes: {codes})")
    else:
        failure = result.first_failure
        err.print(f"[red]job {result.job_id} {result.state}[/], exit code {result.exit_code}")
        if failure is not None:
            _print_root_cause(err, failure)
            rank = f" rank {failure.rank}" if failure.rank is not None else ""
            err.print(f"first failure: {failure.node}{rank}: {failure.reason}", markup=False)
            if failure.last_lines and not failure.traceback:
                err.print(f"last lines from {failure.node}:")
                for line in failure.last_lines:
                    err.print(f"  | {line}", markup=False)
        err.print(f"node exit codes: {codes}")
        _print_stacks_kept(result)
        for failed in result.teardown.failed if result.teardown else ():
            err.print(f"[yellow]teardown on {failed.node}[/]: {escape(failed.why)}")
    for node, problem in result.node_logs.items():
        if problem != "ok":
            err.print(f"[yellow]raw logs of {node} not collected[/]: {problem}")
    err.print(f"record: {result.run_dir}")


class _PipelinePrinter:
    """Prints what the steps before the job found (orchestrator.run.pipeline)."""

    def synced(self, plan: LaunchPlan, results: GroupResult[SyncedFiles]) -> None:
        err = _err()
        for r in results:
            done = r.value
            if done is None:
                err.print(f"[red]sync {r.node}[/]: {escape(r.why)}")
            elif done.shared:
                err.print(f"sync {r.node}: shares {plan.workdir} with the head, nothing to copy")
            else:
                err.print(f"sync {r.node}: {done.sent} files copied, {done.unchanged} unchanged")

    def preflight_failed(self, report: DoctorReport) -> None:
        err = _err()
        for finding in report.errors:
            err.print(f"[red]{finding.node}[/]: {finding.problem}\n  fix: {finding.fix}")

    def started(self, plan: LaunchPlan, run: RunDir) -> None:
        _err().print(
            f"job {plan.job_id}: {plan.launcher} on {plan.shape_text}; record {run.path}"
        )


def _options(*, no_doctor: bool, sync: bool, keep_remote_logs: bool,
             heartbeat_timeout: float, hang_timeout: float | None) -> PipelineOptions:  # fmt: skip
    settings = WatchSettings(heartbeat_timeout=heartbeat_timeout, hang_timeout=hang_timeout)
    return PipelineOptions(
        sync=sync, preflight=not no_doctor, keep_remote_logs=keep_remote_logs, settings=settings
    )


def _execute(build: Callable[[int, bool], LaunchPlan], main_port: int | None, job_id: str,
             root: Path, options: PipelineOptions, *, dry_run: bool, as_json: bool,
             quiet: bool) -> None:  # fmt: skip
    # Built first with the port orch would try first: a bad input is refused, and a dry
    # run shown, before any node is asked.
    plan = plan_with_main_port(build, main_port, job_id, dry_run=True, preflight=False)
    if dry_run:
        text = json.dumps(plan_summary(plan), indent=2) if as_json else plan_text(plan)
        typer.echo(text, nl=as_json)
        return

    def with_port() -> LaunchPlan:
        return plan_with_main_port(build, main_port, job_id, dry_run=False,
                                   preflight=options.preflight)  # fmt: skip

    view = _view(plan, quiet)
    try:
        result = execute_plan(plan, root, options, view=view, reporter=_PipelinePrinter(),
                              with_port=with_port)  # fmt: skip
    finally:
        if view is not None:
            view.close()
    _print_summary(result)
    raise typer.Exit(result.exit_code)


def _script_args(extra: list[str]) -> list[str]:
    """What follows the script. A `--` right after it only separates (`train.py -- --lr 1`),
    as it always has; any later `--` is the script's own."""
    return extra[1:] if extra[:1] == ["--"] else list(extra)


@app.command(context_settings=_CONTEXT)
def launch(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script (then its arguments)."),
    hostfile: Path | None = _HOSTFILE,
    slurm: bool = SLURM,
    fanout: str | None = _FANOUT,
    nodes: int | None = _NODES,
    include: str | None = INCLUDE,
    exclude: str | None = EXCLUDE,
    launcher: str = typer.Option("pdsh", "--launcher", "-l", help="pdsh | standard | torchrun."),
    nproc_per_node: int = typer.Option(None, "--nproc-per-node", help="Ranks per node."),
    python: str = typer.Option(None, "--python", help="Interpreter on the nodes."),
    workdir: str = typer.Option(None, "--workdir", help="Working directory on the nodes."),
    main_port: int | None = _MAIN_PORT,
    env: list[str] = _ENV,
    runs_dir: Path = _RUNS_DIR,
    dry_run: bool = _DRY_RUN,
    as_json: bool = _AS_JSON,
    no_doctor: bool = _NO_DOCTOR,
    sync: bool = _SYNC,
    keep_remote_logs: bool = _KEEP_REMOTE_LOGS,
    quiet: bool = _QUIET,
    heartbeat_timeout: float = _HEARTBEAT_TIMEOUT,
    hang_timeout: float | None = _HANG_TIMEOUT,
) -> None:
    """Run SCRIPT [ARGS...] on every node of the hostfile (use `--` before script options)."""
    check_launcher(launcher)
    given = read_hostfile(hostfile) if hostfile is not None else None
    inventory, allocation = job_inventory(given, slurm=slurm, environ=os.environ,
                                          nproc_per_node=nproc_per_node, nodes=nodes)  # fmt: skip
    hosts = filter_hosts(inventory, include=include, exclude=exclude)
    kind = chosen_fanout(fanout, launcher, allocation is not None)
    root = runs_root(runs_dir)
    job_id = new_job_id()
    head = head_context(job_id, dry_run=dry_run)

    given_env, forwarded = _parse_env(env)

    def build(port: int, chosen: bool) -> LaunchPlan:
        return build_plan(
            job_id=job_id,
            hostfile=hosts,
            script=script,
            args=_script_args(ctx.args),
            launcher=launcher,
            python=python or sys.executable,
            workdir=workdir or os.getcwd(),
            run_dir=str(root / job_id),
            main_port=port,
            main_port_chosen=chosen,
            nproc_per_node=nproc_per_node,
            extra_env=given_env,
            passthrough=forwarded,
            head=head,
            fanout=kind,
            slurm_job=allocation.job_id if allocation else os.environ.get(JOB_ID_VAR, ""),
        )

    options = _options(no_doctor=no_doctor, sync=sync, keep_remote_logs=keep_remote_logs,
                       heartbeat_timeout=heartbeat_timeout, hang_timeout=hang_timeout)  # fmt: skip
    _execute(build, main_port, job_id, root, options, dry_run=dry_run, as_json=as_json,
             quiet=quiet)  # fmt: skip


@app.command()
def submit(
    recipe: Path = _RECIPE,
    hostfile: Path | None = _HOSTFILE,
    slurm: bool = SLURM,
    fanout: str | None = _FANOUT,
    include: str | None = INCLUDE,
    exclude: str | None = EXCLUDE,
    runs_dir: Path = _RUNS_DIR,
    dry_run: bool = _DRY_RUN,
    as_json: bool = _AS_JSON,
    no_doctor: bool = _NO_DOCTOR,
    sync: bool = _SYNC,
    keep_remote_logs: bool = _KEEP_REMOTE_LOGS,
    quiet: bool = _QUIET,
    heartbeat_timeout: float = _HEARTBEAT_TIMEOUT,
    hang_timeout: float | None = _HANG_TIMEOUT,
    main_port: int | None = _MAIN_PORT,
    sbatch: bool = typer.Option(
        False,
        "--sbatch",
        help="Submit to Slurm: a batch job that runs this submit inside a "
        "new allocation (--dry-run shows the script); `orch status`/`kill` follow it.",
    ),
    nodes: int | None = _NODES,
    gpus_per_node: int | None = typer.Option(
        None, "--gpus-per-node", min=1, help="--sbatch: GPUs per node to ask for."
    ),
    time_limit: str | None = typer.Option(None, "--time", help="--sbatch: Slurm's time limit."),
    partition: str | None = typer.Option(None, "--partition", help="--sbatch: the partition."),
    given_job_id: str | None = typer.Option(None, "--job-id", hidden=True),
    script_args: list[str] = _SCRIPT_ARGS,
) -> None:
    """Run a recipe: everything the launch needs, in one file. Extra ARGS go to the script."""
    from orchestrator.specs.recipe import load_recipe, recipe_hosts

    loaded = load_recipe(recipe)
    changes: dict[str, object] = {}
    if main_port is not None:
        changes["main_port"] = main_port
    if script_args:
        changes["args"] = [*loaded.args, *script_args]
    if changes:
        loaded = loaded.model_copy(update=changes)
    root = runs_root(runs_dir)
    if sbatch:
        ignored = [name for name, value in (("--hostfile", hostfile), ("--include", include),
                                            ("--exclude", exclude)) if value]  # fmt: skip
        if ignored:
            raise UsageError(
                f"--sbatch runs on the nodes Slurm allocates: {', '.join(ignored)} cannot apply",
                "ask for them with --nodes N (and the recipe's slurm: section), or run "
                "without --sbatch",
            )
        settings = {"no_doctor": no_doctor, "sync": sync, "keep_remote_logs": keep_remote_logs,
                    "heartbeat_timeout": heartbeat_timeout, "hang_timeout": hang_timeout,
                    "main_port": main_port, "fanout": fanout}  # fmt: skip
        request = {"nodes": nodes, "gpus_per_node": gpus_per_node, "time": time_limit,
                   "partition": partition}  # fmt: skip
        _submit_batch(recipe, loaded, root, settings, request, script_args or [], dry_run)
        return
    given = read_hostfile(hostfile) if hostfile is not None else None
    if given is None and not slurm and allocation_from_env(os.environ) is None:
        given = recipe_hosts(loaded, None)
    inventory, allocation = job_inventory(given, slurm=slurm, environ=os.environ,
                                          nproc_per_node=loaded.nproc_per_node,
                                          nodes=nodes or loaded.slurm.nodes)  # fmt: skip
    hosts = filter_hosts(inventory, include=include, exclude=exclude)
    kind = chosen_fanout(fanout, loaded.launcher, allocation is not None)
    job_id = given_job_id or new_job_id()
    head = head_context(job_id, dry_run=dry_run)

    def build(port: int, _chosen: bool) -> LaunchPlan:
        return plan_from_recipe(
            loaded,
            recipe_path=str(recipe),
            job_id=job_id,
            hostfile=hosts,
            run_dir=str(root / job_id),
            default_python=sys.executable,
            default_workdir=os.getcwd(),
            head=head,
            chosen_port=port,
            fanout=kind,
            slurm_job=allocation.job_id if allocation else os.environ.get(JOB_ID_VAR, ""),
            slurm_batch=given_job_id is not None and allocation is not None,
        )

    options = _options(no_doctor=no_doctor, sync=sync, keep_remote_logs=keep_remote_logs,
                       heartbeat_timeout=heartbeat_timeout,
                       hang_timeout=hang_timeout or loaded.hang_timeout)  # fmt: skip
    _execute(build, loaded.main_port, job_id, root, options, dry_run=dry_run, as_json=as_json,
             quiet=quiet)  # fmt: skip


def _inner_submit(recipe: Path, job_id: str, root: Path, settings: dict,
                  script_args: list[str]) -> list[str]:  # fmt: skip
    """The orch command the batch script runs: this submit, on the allocation's nodes."""
    argv = [sys.executable, "-m", "orchestrator", "submit", str(recipe.resolve()), "--slurm",
            "--job-id", job_id, "--runs-dir", str(root)]  # fmt: skip
    for flag in ("no_doctor", "sync", "keep_remote_logs"):
        if settings[flag]:
            argv.append("--" + flag.replace("_", "-"))
    defaults = {"heartbeat_timeout": WatchSettings.heartbeat_timeout}
    for option in ("heartbeat_timeout", "hang_timeout", "main_port", "fanout"):
        if settings[option] is not None and settings[option] != defaults.get(option):
            argv += ["--" + option.replace("_", "-"), f"{settings[option]}"]
    if script_args:
        argv += ["--", *script_args]
    return argv


def _submit_batch(recipe: Path, loaded: Recipe, root: Path, settings: dict, request: dict,
                  script_args: list[str], dry_run: bool) -> None:  # fmt: skip
    """--sbatch: write the batch script into the job's record, submit it, record the Slurm
    job id; the inner orch writes the rest of the record as the job runs."""
    job_id = new_job_id()
    run = run_dir(root, job_id)
    wanted = loaded.slurm
    batch = batch_request(
        job_id=job_id,
        name=f"orch-{loaded.name}",
        nodes=request["nodes"] or wanted.nodes,
        ntasks_per_node=loaded.nproc_per_node,
        gpus_per_node=request["gpus_per_node"] or wanted.gpus_per_node,
        workdir=loaded.workdir or os.getcwd(),
        output=str(run.path / OUTPUT_NAME),
        command=_inner_submit(recipe, job_id, root, settings, script_args),
        time=request["time"] or wanted.time,
        partition=request["partition"] or wanted.partition,
        account=wanted.account,
    )
    text = render_batch_script(batch)
    if dry_run:
        typer.echo(text, nl=False)
        return
    run.create()
    script = run.write_file(SCRIPT_NAME, text)
    slurm_job = submit_batch(str(script), cwd=batch.workdir)
    record = JobRecord(
        id=job_id, state=JobState.QUEUED, launcher=loaded.launcher, command=batch.command, hosts=(),
        workdir=batch.workdir, started_at=now_iso(), head_pid=0, head_start=None,
        recipe=str(recipe), fanout=chosen_fanout(settings["fanout"], loaded.launcher, True),
        slurm_job_id=slurm_job,
        slurm_batch=True,
    )  # fmt: skip
    run.save(record)
    _err().print(
        f"job {job_id}: submitted as Slurm job {slurm_job} ({batch.nodes} nodes); "
        f"`orch status {job_id}`; its output: {run.path / OUTPUT_NAME}"
    )
    typer.echo(job_id)


def _record_doc(record: JobRecord) -> dict:
    doc = record.to_json()
    doc["recorded_state"] = record.state
    doc["state"] = shown_state(record)
    return doc


@app.command()
def status(
    job: str = typer.Argument(None, help="A job id (or unique prefix); none: list every job."),
    runs_dir: Path = _RUNS_DIR,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """List jobs, or show one: state, nodes, exit codes, first failure."""
    root = runs_root(runs_dir)
    if job is None:
        records = list_jobs(root)
        if as_json:
            docs = [_record_doc(r) for r in records]
            typer.echo(json.dumps({"runs_dir": str(root), "jobs": docs}, indent=2))
            return
        table = Table(title=f"jobs in {root}")
        for column in ("job", "state", "launcher", "nodes", "exit", "started", "ended"):
            table.add_column(column, no_wrap=True)
        for r in records:
            table.add_row(r.id, shown_state(r), r.launcher, str(len(r.hosts)),
                          "" if r.exit_code is None else str(r.exit_code),
                          r.started_at, r.ended_at or "")  # fmt: skip
        # Piped output keeps whole ids and times rather than a terminal's 80 columns.
        Console(highlight=False, width=None if sys.stdout.isatty() else 200).print(table)
        return
    record = find_job(root, job).load()
    if as_json:
        typer.echo(json.dumps(_record_doc(record), indent=2))
        return
    out = Console(highlight=False, soft_wrap=True)
    state = shown_state(record)
    gone = f" (head process {record.head_pid} is gone)" if state == JobState.HEAD_DIED else ""
    out.print(f"job {record.id}: {state}{gone}")
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
    failure = record.first_failure
    if failure is not None:
        _print_root_cause(out, failure)
        rank = f" rank {failure.rank}" if failure.rank is not None else ""
        out.print(f"first failure: {failure.node}{rank}: {failure.reason}", markup=False)
        for line in failure.last_lines if not failure.traceback else ():
            out.print(f"  | {line}", markup=False)


@app.command()
def kill(
    job: str = typer.Argument(..., help="The job id (or a unique prefix)."),
    runs_dir: Path = _RUNS_DIR,
    grace: float = typer.Option(5.0, "--grace", help="Seconds between TERM and KILL."),
) -> None:
    """Stop a job on every node (from any terminal), by its job id."""
    run = find_job(runs_root(runs_dir), job)
    record = run.load()
    err = _err()
    alive = head_alive(record)
    batch = record.slurm_batch and record.slurm_job_id is not None
    if alive or batch:
        (run.path / KILL_MARKER).touch()
    if batch:
        _cancel_batch(record, err)
    if alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(record.head_pid, signal.SIGTERM)
    # Whatever the head does, stop the job on every node by its id.
    ok = True
    if record.hosts:
        outcome = teardown_job(record.hosts, record.id, record.python, grace=grace,
                               timeout=grace + 15)  # fmt: skip
        ok = outcome.ok
        for stopped in outcome:
            err.print(f"{stopped.node}: {stopped.value or stopped.why}", markup=False)
    deadline = time.monotonic() + grace + 30
    while (head_alive(record) or (batch and _slurm_active(record))) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    if batch and _slurm_active(record):
        err.print(f"Slurm job {record.slurm_job_id} still runs", markup=False)
        ok = False
    record = run.load()
    if record.state not in FINAL_STATES:
        # The head is gone (or never answered): record the kill ourselves.
        (run.path / KILL_MARKER).touch()
        record = finished(record, state=JobState.KILLED, exit_code=128 + signal.SIGTERM)
        run.save(record)
    err.print(f"job {record.id}: {shown_state(record)}")
    raise typer.Exit(0 if ok else 1)


def _cancel_batch(record: JobRecord, err: Console) -> None:
    """The batch job is the job's own: Slurm signals orch inside it, which tears the job
    down, and ends the allocation."""
    answer = cancel(str(record.slurm_job_id))
    told = "cancelled" if answer.ok else answer.problem
    err.print(f"Slurm job {record.slurm_job_id}: {told}", markup=False)


def _slurm_active(record: JobRecord) -> bool:
    return job_state(str(record.slurm_job_id)) in ACTIVE_STATES
