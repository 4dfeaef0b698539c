"""What the user asked for, as one frozen value: `orch launch`'s flags, or `orch submit`'s
recipe with its flags (and `--sbatch`). The CLI builds a `JobRequest` once; the prepare
layer turns it into hosts and a plan (prepare/job.py), and `--sbatch` writes it into the batch
script (plan/sbatch_script.py). Pure: the head's environment is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePath

from orchestrator.errors import UsageError
from orchestrator.specs.checkpoints import (
    DEFAULT_BANDWIDTH,
    DEFAULT_COPIES,
    CheckpointSettings,
    bandwidth_bytes,
    check_copies,
    check_dir,
)
from orchestrator.specs.constants import DEFAULT_LAUNCHER
from orchestrator.specs.hang import HANG_AUTO, HangTimeout
from orchestrator.specs.jobenv import check_name
from orchestrator.specs.options import launcher_named
from orchestrator.specs.recipe import AccelerateOptions, Recipe, RecoveryOptions
from orchestrator.specs.slurm import RequeueSettings, chosen_fanout
from orchestrator.specs.stop import StopSettings, check_grace, duration_seconds, signal_named
from orchestrator.specs.words import Fanout


@dataclass(frozen=True)
class LaunchSpec:
    """What a launch runs, whatever the hosts: the script and how it is launched."""

    script: str
    args: tuple[str, ...] = ()
    launcher: str = DEFAULT_LAUNCHER
    python: str | None = None  # None: the head's interpreter
    workdir: str | None = None  # None: the head's working directory
    nproc_per_node: int | None = None  # None: the hostfile's slots
    env: tuple[tuple[str, str], ...] = ()  # set on every rank
    passthrough: tuple[str, ...] = ()  # forwarded from the head's environment when set there
    env_keep: tuple[str, ...] = ()  # names in `env` whose values records may show
    main_port: int | None = None  # None: orch picks one free on node 0
    accelerate: AccelerateOptions = field(default_factory=AccelerateOptions)
    torchrun_args: tuple[str, ...] = ()
    rdzv_id: str | None = None  # None: the job id
    recipe: str | None = None  # the recipe file it came from
    stop: StopSettings = field(default_factory=StopSettings)  # what a stop sends, its grace
    name: str | None = None  # what the user calls the job: --name, the recipe's, the script's
    # --checkpoint-dir and its options, else the recipe's; the dir may be relative to the
    # workdir (the plan holds it absolute). None: orch leaves checkpoints alone.
    checkpoints: CheckpointSettings | None = None


@dataclass(frozen=True)
class HostsRequest:
    """Where the job's nodes come from: --hostfile, --slurm (or the allocation this runs in),
    the recipe's own hosts; then --include/--exclude."""

    hostfile: str | None = None
    slurm: bool = False
    nodes: int | None = None  # the allocation's first N; with --sbatch, how many to ask for
    nodelist: str | None = None  # -w: a node set instead of a hostfile (--nproc-per-node each)
    include: str | None = None
    exclude: str | None = None
    transport: str | None = None  # --transport: ssh or slurm; None: decided up front


@dataclass(frozen=True)
class WatchRequest:
    """How orch runs and watches the job: nothing of it changes the plan."""

    preflight: bool = True
    sync: bool = False
    keep_remote_logs: bool = False
    heartbeat_timeout: float | None = None  # None: the default (outcome/events.py)
    hang_timeout: HangTimeout | None = None  # None: the recipe's, else auto
    push_env: bool = False  # --push-env: copy the head's environment where it differs
    time_limit: float | None = None  # --time-limit in seconds; None: the recipe's, else none
    stop_signal: str | None = None  # --stop-signal as given (the spec holds the one used)
    stop_grace: float | None = None  # --stop-grace as given


@dataclass(frozen=True)
class RecoveryRequest:
    """--max-restarts, --restart-on and --min-nodes as given (None: the recipe's, else the
    default: one attempt, infrastructure faults only, every node needed)."""

    max_restarts: int | None = None
    restart_on: str | None = None
    min_nodes: int | None = None


@dataclass(frozen=True)
class CheckpointRequest:
    """--checkpoint-dir, --checkpoint-copies and --checkpoint-bandwidth as given (None: the
    recipe's, else no checkpoints / the default); the spec holds the settings used."""

    dir: str | None = None
    copies: int | None = None
    bandwidth: str | None = None


@dataclass(frozen=True)
class SbatchRequest:
    """`--sbatch`: what to ask Slurm for beyond the recipe's `slurm:` section."""

    gpus_per_node: int | None = None
    time: str | None = None
    partition: str | None = None


@dataclass(frozen=True)
class RequeueRequest:
    """`--requeue` and `--max-requeues` as given (False, None: the recipe's `slurm:`)."""

    requeue: bool = False
    max_requeues: int | None = None


@dataclass(frozen=True)
class LaunchOverrides:
    """`orch submit`'s options over its recipe's values (those of `orch launch`), as given:
    each given one wins; None or empty: the recipe's."""

    launcher: str | None = None
    nproc_per_node: int | None = None
    python: str | None = None
    workdir: str | None = None
    env: tuple[str, ...] = ()  # --env NAME=VALUE (set) or NAME (forwarded), as given


@dataclass(frozen=True)
class JobRequest:
    """One request, from the command line (and a recipe) to the job."""

    spec: LaunchSpec
    hosts: HostsRequest = field(default_factory=HostsRequest)
    watch: WatchRequest = field(default_factory=WatchRequest)
    fanout: str | None = None  # --fanout: pdsh or srun; None: chosen by where the job runs
    main_port: int | None = None  # --main-port as given (the spec also holds a recipe's)
    runs_dir: str | None = None
    recipe: Recipe | None = None  # submit: the loaded recipe (its hosts, its Slurm section)
    extra_args: tuple[str, ...] = ()  # submit: the ARGS after the recipe (also in the spec)
    sbatch: SbatchRequest | None = None
    recovery: RecoveryRequest = field(default_factory=RecoveryRequest)
    env_keep: tuple[str, ...] = ()  # --env-keep as given (the spec also holds a recipe's)
    job_id: str | None = None  # given: the batch script's own submit names its job
    overrides: LaunchOverrides = field(default_factory=LaunchOverrides)  # submit: over the recipe
    checkpoints: CheckpointRequest = field(default_factory=CheckpointRequest)  # as given
    requeue: RequeueRequest = field(default_factory=RequeueRequest)  # as given

    @property
    def hang_timeout(self) -> HangTimeout:
        """--hang-timeout, else the recipe's, else auto (learned from the job's pace)."""
        if self.watch.hang_timeout is not None:
            return self.watch.hang_timeout
        recipe = self.recipe.hang_timeout if self.recipe is not None else None
        return HANG_AUTO if recipe is None else recipe

    @property
    def time_limit(self) -> float | None:
        """--time-limit, else the recipe's (seconds); None: the job runs until it ends."""
        if self.watch.time_limit is not None:
            return self.watch.time_limit
        given = self.recipe.time_limit if self.recipe is not None else None
        return duration_seconds(given, "time_limit") if given is not None else None

    @property
    def push_env(self) -> bool:
        """--push-env, or the recipe's `push_env: true`."""
        return self.watch.push_env or (self.recipe is not None and self.recipe.push_env)

    @property
    def max_restarts(self) -> int:
        """--max-restarts, else the recipe's, else 0."""
        given = self.recovery.max_restarts
        return given if given is not None else self._recipe_recovery.max_restarts

    @property
    def restart_on(self) -> str:
        """--restart-on, else the recipe's, else infra."""
        return self.recovery.restart_on or self._recipe_recovery.restart_on

    @property
    def min_nodes(self) -> int | None:
        """--min-nodes, else the recipe's; None: every node of the job is needed."""
        given = self.recovery.min_nodes
        return given if given is not None else self._recipe_recovery.min_nodes

    @property
    def requeue_settings(self) -> RequeueSettings:
        """--requeue or the recipe's `slurm: {requeue: true}`; --max-requeues, else the
        recipe's, else the default."""
        wanted = self.recipe.slurm if self.recipe is not None else None
        given = self.requeue
        most = given.max_requeues if given.max_requeues is not None else (
            wanted.max_requeues if wanted is not None else None)  # fmt: skip
        return RequeueSettings(
            requeue=given.requeue or (wanted is not None and wanted.requeue),
            max_requeues=RequeueSettings.max_requeues if most is None else most,
        )

    @property
    def _recipe_recovery(self) -> RecoveryOptions:
        return self.recipe.recovery if self.recipe is not None else RecoveryOptions()


def env_options(
    pairs: Sequence[str], environ: Mapping[str, str]
) -> tuple[dict[str, str], tuple[str, ...]]:
    """(values set, names forwarded): --env NAME=VALUE sets NAME; --env NAME forwards the
    head's value of NAME (kept out of records and logs as a secret)."""
    env: dict[str, str] = {}
    forwarded: list[str] = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not name:
            raise UsageError(f"--env {pair!r} names no variable", "e.g. --env NCCL_DEBUG=INFO")
        if not sep:
            if name not in environ:
                raise UsageError(
                    f"--env {name}: {name} is not set on the head, so there is no value to "
                    "forward",
                    f"set it (export {name}=...) or give one: --env {name}=VALUE",
                )
            forwarded.append(name)
            continue
        env[name] = value
    return env, tuple(forwarded)


def kept_env(spec: LaunchSpec, names: Sequence[str]) -> LaunchSpec:
    """The spec with `names` (--env-keep) added to the names whose values records show."""
    for name in names:
        check_name(name)
    return replace(spec, env_keep=tuple(dict.fromkeys((*spec.env_keep, *names))))


def launch_spec(script: str, args: Sequence[str], *, launcher: str, env: Sequence[str],
                environ: Mapping[str, str], nproc_per_node: int | None = None,
                python: str | None = None, workdir: str | None = None,
                main_port: int | None = None) -> LaunchSpec:  # fmt: skip
    """`orch launch`'s flags as a spec; `environ` the head's (what --env NAME forwards)."""
    given, forwarded = env_options(env, environ)
    return LaunchSpec(
        script=script, args=tuple(args), launcher=launcher_named(launcher), python=python,
        workdir=workdir,
        nproc_per_node=nproc_per_node, env=tuple(given.items()), passthrough=forwarded,
        main_port=main_port, name=PurePath(script).stem or None,
    )  # fmt: skip


def recipe_spec(recipe: Recipe, path: str, *, extra_args: Sequence[str] = (),
                main_port: int | None = None,
                overrides: LaunchOverrides = LaunchOverrides(),
                environ: Mapping[str, str] | None = None) -> LaunchSpec:  # fmt: skip
    """A recipe as a spec, with the ARGS, --main-port and launch's options given after it
    (`overrides`: each given one wins over the recipe's); `environ` the head's (what --env
    NAME forwards)."""
    given = overrides
    env, passthrough = _env_over(recipe, given.env, environ or {})
    return LaunchSpec(
        script=recipe.script,
        args=(*recipe.args, *extra_args),
        launcher=launcher_named(given.launcher) if given.launcher else recipe.launcher,
        python=given.python or recipe.python,
        workdir=given.workdir or recipe.workdir,
        nproc_per_node=given.nproc_per_node or recipe.nproc_per_node,
        env=tuple(env.items()),
        passthrough=passthrough,
        env_keep=tuple(recipe.env_keep),
        main_port=main_port if main_port is not None else recipe.main_port,
        accelerate=recipe.accelerate,
        torchrun_args=tuple(recipe.torchrun.extra_args),
        rdzv_id=recipe.torchrun.rdzv_id,
        recipe=path,
        name=recipe.name,
        stop=StopSettings(recipe.stop_signal or StopSettings.signal,
                          recipe.stop_grace or StopSettings.grace),
        checkpoints=recipe_checkpoints(recipe),
    )


def recipe_checkpoints(recipe: Recipe) -> CheckpointSettings | None:
    """A recipe's checkpoint_dir and its keys (checked as the recipe was read)."""
    if recipe.checkpoint_dir is None:
        return None
    copies, bandwidth = recipe.checkpoint_copies, recipe.checkpoint_bandwidth
    return CheckpointSettings(
        dir=recipe.checkpoint_dir,
        copies=DEFAULT_COPIES if copies is None else copies,
        bandwidth=DEFAULT_BANDWIDTH if bandwidth is None else bandwidth,
    )


def _env_over(recipe: Recipe, pairs: Sequence[str],
              environ: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:  # fmt: skip
    """The recipe's env and passthrough_env with --env given over them: a name given wins,
    set (NAME=VALUE) or forwarded (NAME), whichever the recipe did with it."""
    given, forwarded = env_options(pairs, environ)
    env = {name: value for name, value in recipe.env.items() if name not in forwarded}
    env.update(given)
    passthrough = [name for name in recipe.passthrough_env if name not in given]
    passthrough += [name for name in forwarded if name not in passthrough]
    return env, tuple(passthrough)


def with_stop(spec: LaunchSpec, signal: str | None, grace: float | None) -> LaunchSpec:
    """The spec with --stop-signal and --stop-grace where given (each checked: a UsageError
    names what is wrong before anything runs)."""
    chosen = StopSettings(
        signal_named(signal) if signal is not None else spec.stop.signal,
        check_grace(grace) if grace is not None else spec.stop.grace,
    )
    return replace(spec, stop=chosen)


def with_checkpoints(spec: LaunchSpec, given: CheckpointRequest) -> LaunchSpec:
    """The spec with the checkpoint options given over its own (a recipe's), each checked;
    --checkpoint-copies or --checkpoint-bandwidth with no directory, given or the recipe's,
    is a UsageError."""
    base = spec.checkpoints
    if given.dir is None and base is None:
        loose = [name for name, value in (("--checkpoint-copies", given.copies),
                                          ("--checkpoint-bandwidth", given.bandwidth))
                 if value is not None]  # fmt: skip
        if loose:
            named = " and ".join(loose)
            goes = "go" if len(loose) > 1 else "goes"
            raise UsageError(
                f"{named} {goes} with --checkpoint-dir: how orch copies the checkpoints of "
                "that directory",
                "add --checkpoint-dir PATH (where the job writes its checkpoints, the same "
                f"path on every node), or leave {named} out",
            )
        return spec
    base = base or CheckpointSettings(dir="")  # the defaults; the dir is the one given
    chosen = CheckpointSettings(
        dir=check_dir(given.dir) if given.dir is not None else base.dir,
        copies=check_copies(given.copies) if given.copies is not None else base.copies,
        bandwidth=bandwidth_bytes(given.bandwidth) if given.bandwidth is not None
        else base.bandwidth,
    )  # fmt: skip
    return replace(spec, checkpoints=chosen)


def check_sbatch_checkpoints(request: JobRequest) -> None:
    """A batch job whose nodes srun would start cannot have its checkpoints copied (orch
    copies them over SSH): refused when it is submitted, not once it runs."""
    if request.sbatch is None or request.spec.checkpoints is None:
        return
    if chosen_fanout(request.fanout, request.spec.launcher, in_allocation=True) == Fanout.SRUN:
        raise UsageError(*SRUN_CHECKPOINTS)


# Why a job that srun starts cannot have --checkpoint-dir yet, and what to do instead.
SRUN_CHECKPOINTS = (
    "--checkpoint-dir is not supported yet on nodes started by srun (the Slurm fan-out): orch "
    "copies checkpoints between nodes over SSH",
    "run over SSH with a hostfile (--hostfile FILE; inside an allocation, --fanout pdsh "
    "--transport ssh), or leave --checkpoint-dir out if every node sees the directory (a "
    "shared filesystem)",
)


RESTART_ON = ("infra", "any")


def check_push_env(request: JobRequest) -> None:
    """--push-env pushes where the pre-flight finds the environment differs: it needs it."""
    if request.push_env and not request.watch.preflight:
        given = "--push-env" if request.watch.push_env else "the recipe's push_env: true"
        raise UsageError(
            f"{given} needs the pre-flight, which finds the nodes whose environment differs; "
            "--no-doctor skips it",
            "leave out --no-doctor (or --push-env)",
        )


def check_recovery(recovery: RecoveryRequest) -> None:
    """--restart-on names a policy orch knows."""
    if recovery.restart_on is not None and recovery.restart_on not in RESTART_ON:
        raise UsageError(
            f"--restart-on {recovery.restart_on!r} is not a policy orch knows",
            "--restart-on infra (node lost, hang, signal, transient faults; the default) or "
            "--restart-on any (the script's own errors too)",
        )


def check_requeue(requeue: RequeueRequest, *, sbatch: bool, batch_run: bool) -> None:
    """--requeue puts a batch job back in Slurm's queue: it needs --sbatch (or is the batch
    script's own submit, which --sbatch wrote)."""
    given = [name for name, value in (("--requeue", requeue.requeue),
                                      ("--max-requeues", requeue.max_requeues is not None))
             if value]  # fmt: skip
    if given and not sbatch and not batch_run:
        raise UsageError(
            f"{' and '.join(given)}: only a Slurm batch job is requeued, and without --sbatch "
            "this submit runs none",
            "add --sbatch (`orch submit RECIPE --sbatch --requeue`), or leave them out",
        )


def check_sbatch_hosts(hosts: HostsRequest) -> None:
    """--sbatch runs on the nodes Slurm allocates: options naming nodes cannot apply."""
    named = (("--hostfile", hosts.hostfile), ("--nodelist", hosts.nodelist),
             ("--include", hosts.include), ("--exclude", hosts.exclude))  # fmt: skip
    ignored = [name for name, value in named if value]
    if ignored:
        raise UsageError(
            f"--sbatch runs on the nodes Slurm allocates: {', '.join(ignored)} cannot apply",
            "ask for them with --nodes N (and the recipe's slurm: section), or run "
            "without --sbatch",
        )
