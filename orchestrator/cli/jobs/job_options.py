"""The options `orch launch` and `orch submit` share, declared once: `JobOptions` holds them,
and `with_job_options` gives a command each of them as an option, then hands it the one
value. `job_request` makes the request's parts of them (plan/request.py)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_type_hints

import typer
from typer.models import OptionInfo

from orchestrator.cli.options import (
    CHECKPOINTS_PANEL,
    EXCLUDE,
    INCLUDE,
    LAUNCHER_HELP,
    LAUNCHER_PANEL,
    NODES_PANEL,
    OUTPUT_PANEL,
    RECOVERY_PANEL,
    RUNS_DIR,
    SCRIPT_PANEL,
    SLURM,
    STOPS_PANEL,
    TRANSPORT,
    in_panel,
    nodelist_option,
    nodes_option,
    one_of,
)
from orchestrator.outcome.events import WatchSettings
from orchestrator.outcome.states import HANG_EXIT_CODE
from orchestrator.plan.request import (
    RESTART_ON,
    CheckpointRequest,
    HostsRequest,
    JobRequest,
    LaunchSpec,
    RecoveryRequest,
    WatchRequest,
    check_push_env,
    check_recovery,
    check_sbatch_checkpoints,
    kept_env,
    with_checkpoints,
    with_stop,
)
from orchestrator.specs.checkpoints import DEFAULT_BANDWIDTH_TEXT, DEFAULT_COPIES
from orchestrator.specs.constants import LAUNCHERS
from orchestrator.specs.hang import hang_timeout_value
from orchestrator.specs.options import check_heartbeat_timeout
from orchestrator.specs.secret_args import secret_args
from orchestrator.specs.stop import DEFAULT_STOP_GRACE_S, duration_seconds
from orchestrator.specs.words import Fanout

_DECLARED = "option"  # the field's typer declaration, in its metadata


def _declared(option: OptionInfo) -> dict[str, OptionInfo]:
    return {_DECLARED: option}


_HOSTFILE = typer.Option(
    None,
    "--hostfile",
    "-H",
    help="DeepSpeed hostfile. Default: ORCH_HOSTFILE, else a defaults file's (./orch.toml, "
    "~/.config/orch/config.toml).",
    rich_help_panel=NODES_PANEL,
)
_FANOUT = typer.Option(
    None,
    "--fanout",
    help="What starts every node: pdsh (over ssh), or srun (one Slurm step; the default "
    "inside an allocation for the standard and torchrun launchers).",
    **one_of(Fanout),
    rich_help_panel=LAUNCHER_PANEL,
)
_NODES = in_panel(
    nodes_option(
        "Run on the first N healthy nodes of the hostfile (or of the allocation): the rest "
        "are spares that replace a node lost on a restart. With --sbatch, how many to ask "
        "Slurm for. Default: every node."
    ),
    NODES_PANEL,
)
_NODELIST = in_panel(
    nodelist_option(
        "Run on these nodes ('gpu[01-04]', 'a,b'; the first is node 0), each with "
        "--nproc-per-node ranks, instead of a hostfile (submit: instead of the recipe's hosts).",
        count_hint="did you mean -N {count}?",
    ),
    NODES_PANEL,
)
_MIN_NODES = typer.Option(
    None,
    "--min-nodes",
    min=1,
    help="When no spare is left, restart on fewer nodes, down to M (the world size "
    "changes). Default: every node of the job is needed.",
    rich_help_panel=RECOVERY_PANEL,
)
_MAX_RESTARTS = typer.Option(
    None,
    "--max-restarts",
    min=0,
    help="Restart a failed job up to N times under the same job id, on the healthy nodes, "
    "when a restart can fix it (see --restart-on). Each rank sees ORCH_RESTART_COUNT. "
    "Default: 0.",
    rich_help_panel=RECOVERY_PANEL,
)
_RESTART_ON = typer.Option(
    None,
    "--restart-on",
    help="infra: restart after a node lost, a hang, a rank killed by a signal, a known "
    "transient NCCL/gloo/CUDA fault (the default); any: the script's own errors too.",
    **one_of(RESTART_ON),
    rich_help_panel=RECOVERY_PANEL,
)
_CHECKPOINT_DIR = typer.Option(
    None,
    "--checkpoint-dir",
    metavar="PATH",
    help="The directory, the same path on every node, where the job writes its checkpoints "
    "(ranks see ORCH_CHECKPOINT_DIR; a relative path is in the workdir). Without a shared "
    "filesystem orch copies each complete checkpoint to --checkpoint-copies other nodes and "
    "stages the newest whole one on the next attempt's nodes. Recipe: checkpoint_dir.",
    rich_help_panel=CHECKPOINTS_PANEL,
)
_CHECKPOINT_COPIES = typer.Option(
    None,
    "--checkpoint-copies",
    metavar="K",
    help="How many other nodes hold a copy of each complete checkpoint (at least 1). "
    f"Recipe: checkpoint_copies. Default: {DEFAULT_COPIES}.",
    rich_help_panel=CHECKPOINTS_PANEL,
)
_CHECKPOINT_BANDWIDTH = typer.Option(
    None,
    "--checkpoint-bandwidth",
    metavar="RATE",
    help="The most bytes per second the copies take from the network (200M, 1G, 500k; 0 "
    "or off: no cap); they run at low CPU and I/O priority. Recipe: checkpoint_bandwidth. "
    f"Default: {DEFAULT_BANDWIDTH_TEXT}.",
    rich_help_panel=CHECKPOINTS_PANEL,
)
_MAIN_PORT = typer.Option(
    None,
    "--main-port",
    help="Rendezvous port on node 0 (default: a recipe's, else one orch finds free there).",
    rich_help_panel=LAUNCHER_PANEL,
)
_DRY_RUN = typer.Option(
    False,
    "--dry-run",
    help="Print the plan (every file and command line), run nothing.",
    rich_help_panel=OUTPUT_PANEL,
)
_AS_JSON = typer.Option(
    False,
    "--json",
    help="Print one JSON document on stdout: with --dry-run the plan; else, once the job "
    "has ended, its record (as `orch status JOB --json`), the job's output and summary "
    "going to stderr; with --sbatch, the queued job's. The exit code stays the job's.",
    rich_help_panel=OUTPUT_PANEL,
)
_NO_DOCTOR = typer.Option(
    False, "--no-doctor", help="Skip the pre-flight checks.", rich_help_panel=SCRIPT_PANEL
)
_PUSH_ENV = typer.Option(
    False,
    "--push-env",
    help="Where the pre-flight finds a node's Python environment is not the head's (the "
    "--python interpreter's venv or conda env), push the head's there first (`orch env "
    "push`), then check again. Recipe: push_env: true.",
    rich_help_panel=SCRIPT_PANEL,
)
_SYNC = typer.Option(
    False,
    "--sync",
    help="Copy the working directory to every node first (no shared FS).",
    rich_help_panel=SCRIPT_PANEL,
)
_KEEP_REMOTE_LOGS = typer.Option(
    False,
    "--keep-remote-logs",
    help="Leave each node's raw logs in /tmp/orch-<uid>/runs/<job>/ (<uid>: your uid on the "
    "node; $ORCH_NODE_ROOT/runs/<job>/ when set) after pulling them back.",
    rich_help_panel=OUTPUT_PANEL,
)
_QUIET = typer.Option(
    False, "--quiet", "-q", help="Do not echo the job's output.", rich_help_panel=OUTPUT_PANEL
)
_HEARTBEAT_TIMEOUT = typer.Option(
    WatchSettings.heartbeat_timeout,
    "--heartbeat-timeout",
    help="Seconds of silence after which a node has failed (at least 6: three of its "
    "agent's beats).",
    rich_help_panel=STOPS_PANEL,
)
_HANG_TIMEOUT = typer.Option(
    None,
    "--hang-timeout",
    metavar="auto[:FLOOR[:START]]|off|SECONDS",
    help="How long the job may be quiet (no rank's line or progress) with no rank working: "
    "orch looks at every rank as the quiet nears it, and when none is working (no CPU, no "
    "storage I/O, or waiting in a collective) the job hung: every rank's stack is taken, the "
    "job torn down, exit code "
    f"{HANG_EXIT_CODE}. auto (the default): learned from the job's own pace, at least 2 "
    "minutes (10 before its first steps); auto:1m:20m sets those floors; a number (600, "
    "10m) fixes it; off: never. Recipe: hang_timeout.",
    rich_help_panel=STOPS_PANEL,
)
_STOP_SIGNAL = typer.Option(
    None,
    "--stop-signal",
    help="What a stop (the first Ctrl-C, `orch stop`, --time-limit) sends every rank, to "
    "its own process only: save and exit. Ranks see it as ORCH_STOP_SIGNAL. Recipe: "
    "stop_signal. Default: SIGTERM.",
    rich_help_panel=STOPS_PANEL,
)
_STOP_GRACE = typer.Option(
    None,
    "--stop-grace",
    help="Seconds a stop gives the ranks to exit by themselves (ORCH_STOP_GRACE) before "
    f"the job is torn down. Recipe: stop_grace. Default: {DEFAULT_STOP_GRACE_S:g}.",
    rich_help_panel=STOPS_PANEL,
)
_TIME_LIMIT = typer.Option(
    None,
    "--time-limit",
    metavar="DURATION",
    help="Stop the job this long after it started (3600, 90m, 2h, 1h30m; restarts "
    "included), as `orch stop` does; exit code 124. Recipe: time_limit.",
    rich_help_panel=STOPS_PANEL,
)

_ENV_KEEP = typer.Option(
    [],
    "--env-keep",
    metavar="NAME",
    help="Show NAME's value in the job's record (env.json) and the dry run (repeat). Every "
    "value of --env (and of a recipe's env) shows as *** otherwise; a name holding TOKEN, "
    "KEY, SECRET or PASSWORD, and what --env NAME forwards, always does.",
    rich_help_panel=SCRIPT_PANEL,
)

# What runs: `orch launch` says it with these, `orch submit` over its recipe's values.
_LAUNCHER = typer.Option(
    None,
    "--launcher",
    "-l",
    help=f"{LAUNCHER_HELP}. Default: a defaults file's, else pdsh (submit: the recipe's).",
    **one_of(LAUNCHERS),
    rich_help_panel=LAUNCHER_PANEL,
)
_NPROC_PER_NODE = typer.Option(
    None,
    "--nproc-per-node",
    help="Ranks per node (default: the hostfile's slots; submit: the recipe's nproc_per_node).",
    rich_help_panel=LAUNCHER_PANEL,
)
_PYTHON = typer.Option(
    None,
    "--python",
    help="Interpreter on the nodes (default: the recipe's, else a defaults file's, else the "
    "head's).",
    rich_help_panel=SCRIPT_PANEL,
)
_WORKDIR = typer.Option(
    None,
    "--workdir",
    help="Working directory on the nodes (default: the head's; submit: the recipe's).",
    rich_help_panel=SCRIPT_PANEL,
)
_NAME = typer.Option(
    None,
    "--name",
    help="What to call the job in `orch status` (--name filters by it). Default: the recipe's "
    "name, else the script's file name without its suffix.",
    rich_help_panel=SCRIPT_PANEL,
)
_ENV = typer.Option(
    [],
    "--env",
    metavar="NAME[=VALUE]",
    help="NAME=VALUE for every rank; NAME alone forwards the head's value (repeat; submit: "
    "over the recipe's env).",
    rich_help_panel=SCRIPT_PANEL,
)


@dataclass(frozen=True)
class JobOptions:
    """Where the job runs, how orch watches it, and what it prints: each field's metadata
    holds its typer option."""

    # In the order of their panels in `--help`: nodes, script, launcher, recovery,
    # checkpoints, stops, output.
    hostfile: Path | None = field(metadata=_declared(_HOSTFILE))
    nodelist: str | None = field(metadata=_declared(_NODELIST))
    nodes: int | None = field(metadata=_declared(_NODES))
    include: str | None = field(metadata=_declared(in_panel(INCLUDE, NODES_PANEL)))
    exclude: str | None = field(metadata=_declared(in_panel(EXCLUDE, NODES_PANEL)))
    slurm: bool = field(metadata=_declared(in_panel(SLURM, NODES_PANEL)))
    python: str | None = field(metadata=_declared(_PYTHON))
    workdir: str | None = field(metadata=_declared(_WORKDIR))
    name: str | None = field(metadata=_declared(_NAME))
    env: list[str] = field(metadata=_declared(_ENV))
    env_keep: list[str] = field(metadata=_declared(_ENV_KEEP))
    sync: bool = field(metadata=_declared(_SYNC))
    push_env: bool = field(metadata=_declared(_PUSH_ENV))
    no_doctor: bool = field(metadata=_declared(_NO_DOCTOR))
    launcher: str | None = field(metadata=_declared(_LAUNCHER))
    nproc_per_node: int | None = field(metadata=_declared(_NPROC_PER_NODE))
    main_port: int | None = field(metadata=_declared(_MAIN_PORT))
    fanout: str | None = field(metadata=_declared(_FANOUT))
    transport: str | None = field(metadata=_declared(in_panel(TRANSPORT, LAUNCHER_PANEL)))
    max_restarts: int | None = field(metadata=_declared(_MAX_RESTARTS))
    restart_on: str | None = field(metadata=_declared(_RESTART_ON))
    min_nodes: int | None = field(metadata=_declared(_MIN_NODES))
    checkpoint_dir: str | None = field(metadata=_declared(_CHECKPOINT_DIR))
    checkpoint_copies: int | None = field(metadata=_declared(_CHECKPOINT_COPIES))
    checkpoint_bandwidth: str | None = field(metadata=_declared(_CHECKPOINT_BANDWIDTH))
    hang_timeout: str | None = field(metadata=_declared(_HANG_TIMEOUT))
    heartbeat_timeout: float = field(metadata=_declared(_HEARTBEAT_TIMEOUT))
    stop_signal: str | None = field(metadata=_declared(_STOP_SIGNAL))
    stop_grace: float | None = field(metadata=_declared(_STOP_GRACE))
    run_time_limit: str | None = field(metadata=_declared(_TIME_LIMIT))
    dry_run: bool = field(metadata=_declared(_DRY_RUN))
    as_json: bool = field(metadata=_declared(_AS_JSON))
    quiet: bool = field(metadata=_declared(_QUIET))
    runs_dir: Path | None = field(metadata=_declared(in_panel(RUNS_DIR, OUTPUT_PANEL)))
    keep_remote_logs: bool = field(metadata=_declared(_KEEP_REMOTE_LOGS))


def with_job_options(command: Callable[..., None]) -> Callable[..., None]:
    """`command(..., options: JobOptions)` as typer sees it: its own parameters, with every
    field of JobOptions as an option in the place of `options`."""
    own = inspect.signature(command)
    own_hints = get_type_hints(command, include_extras=True)
    hints = get_type_hints(JobOptions, include_extras=True)
    names = [f.name for f in fields(JobOptions)]
    shared = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                default=f.metadata[_DECLARED], annotation=hints[f.name])
              for f in fields(JobOptions)]  # fmt: skip
    params: list[inspect.Parameter] = []
    for param in own.parameters.values():
        if param.name == "options":
            params += shared
        else:
            hint = own_hints.get(param.name, param.annotation)
            params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hint))

    @functools.wraps(command)
    def typed(**values: Any) -> None:
        options = JobOptions(**{name: values.pop(name) for name in names})
        command(options=options, **values)

    del typed.__wrapped__  # typer reads the signature below, not the command's own
    typed.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
    typed.__annotations__ = {p.name: p.annotation for p in params}
    return typed


def secret_args_warnings(args: tuple[str, ...]) -> list[str]:
    """What the launch says of each script argument that looks like a secret: a rank's argv
    is readable by every user of its node for the whole job."""
    lines = []
    for found in secret_args(args):
        name = found.variable
        lines.append(
            f"warning: the script's argument {found.option} looks like a secret, and every "
            "user of a node can read a rank's arguments (/proc/<pid>/cmdline) while it runs; "
            f"pass it in the environment instead: export {name}=... on the head, add "
            f"--env {name} (a recipe: passthrough_env: [{name}]) and have the script read "
            f"${name}"
        )
    return lines


def job_request(options: JobOptions, spec: LaunchSpec, *, nodes: int | None,
                **more: Any) -> JobRequest:  # fmt: skip
    """The request the options and a spec make: `nodes` as wanted (--nodes, or a recipe's),
    `more` the request's other fields. Warns (stderr) of script arguments that look like
    secrets: launch and submit both come through here."""
    for line in secret_args_warnings(spec.args):
        typer.echo(line, err=True)
    heartbeat = options.heartbeat_timeout
    check_heartbeat_timeout(heartbeat)
    limit = options.run_time_limit
    watch = WatchRequest(
        preflight=not options.no_doctor, sync=options.sync,
        keep_remote_logs=options.keep_remote_logs,
        heartbeat_timeout=None if heartbeat == WatchSettings.heartbeat_timeout else heartbeat,
        hang_timeout=hang_timeout_value(options.hang_timeout), push_env=options.push_env,
        time_limit=duration_seconds(limit) if limit is not None else None,
        stop_signal=options.stop_signal, stop_grace=options.stop_grace,
    )  # fmt: skip
    spec = with_stop(spec, options.stop_signal, options.stop_grace)
    checkpoints = CheckpointRequest(options.checkpoint_dir, options.checkpoint_copies,
                                    options.checkpoint_bandwidth)  # fmt: skip
    spec = with_checkpoints(spec, checkpoints)
    if options.name:
        spec = replace(spec, name=options.name)
    hosts = HostsRequest(
        hostfile=str(options.hostfile) if options.hostfile is not None else None,
        slurm=options.slurm, nodes=nodes, include=options.include, exclude=options.exclude,
        transport=options.transport, nodelist=options.nodelist,
    )  # fmt: skip
    runs_dir = str(options.runs_dir) if options.runs_dir is not None else None
    keep = tuple(options.env_keep)
    recovery = RecoveryRequest(max_restarts=options.max_restarts, restart_on=options.restart_on,
                               min_nodes=options.min_nodes)  # fmt: skip
    check_recovery(recovery)
    request = JobRequest(spec=kept_env(spec, keep), hosts=hosts, watch=watch,
                         fanout=options.fanout, main_port=options.main_port, runs_dir=runs_dir,
                         env_keep=keep, recovery=recovery, checkpoints=checkpoints,
                         **more)  # fmt: skip
    check_push_env(request)
    check_sbatch_checkpoints(request)
    return request
