"""`orch submit RECIPE --sbatch`: the batch script that runs the same request (the same
submit, on the allocation's nodes) inside a new Slurm allocation, as text. Pure."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import UsageError
from orchestrator.plan.request import JobRequest
from orchestrator.specs.slurm import SLURM_STOP_MARGIN_S

_SIGNAL_MAX_S = 65535  # the most sbatch --signal's @time takes


@dataclass(frozen=True)
class BatchRequest:
    """What the allocation holds and what runs in it (`command`: orch itself, which takes
    the nodes from the allocation and starts them with srun)."""

    job_id: str
    name: str
    nodes: int
    ntasks_per_node: int
    workdir: str
    output: str
    command: tuple[str, ...]
    gpus_per_node: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    # --max-restarts: the allocation outlives a node that fails, so the job can go on in it
    # (Slurm ends the whole job on a node's failure otherwise).
    no_kill: bool = False
    # Seconds before the allocation's end at which Slurm sends orch (the batch shell, which
    # it execs) SIGUSR1: the ranks' grace and the teardown fit before the end.
    warn_before: int | None = None
    # --requeue: Slurm may requeue the job (orch does, with `scontrol requeue`, which Slurm
    # refuses for a job that is not requeueable where the cluster's JobRequeue=0), and the
    # batch job's output is appended to by every allocation, not started anew.
    requeue: bool = False


def batch_request(
    *,
    job_id: str,
    name: str,
    nodes: int | None,
    ntasks_per_node: int | None,
    gpus_per_node: int | None,
    workdir: str,
    output: str,
    command: Sequence[str],
    time: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    no_kill: bool = False,
    warn_before: int | None = None,
    requeue: bool = False,
) -> BatchRequest:
    if nodes is None:
        raise UsageError(
            "--sbatch needs a node count",
            "pass --nodes N, or set `slurm: {nodes: N}` in the recipe",
        )
    return BatchRequest(
        job_id=job_id, name=name, nodes=nodes,
        ntasks_per_node=ntasks_per_node or gpus_per_node or 1, workdir=workdir, output=output,
        command=tuple(command), gpus_per_node=gpus_per_node, time=time, partition=partition,
        account=account, no_kill=no_kill, warn_before=warn_before, requeue=requeue,
    )  # fmt: skip


def request_batch(request: JobRequest, *, job_id: str, cwd: str, output: str,
                  command: Sequence[str]) -> BatchRequest:  # fmt: skip
    """The allocation a `--sbatch` request asks for: its options, else the recipe's `slurm:`
    section; `cwd` the head's working directory (the job's, unless the recipe names one)."""
    if request.recipe is None or request.sbatch is None:
        raise ValueError("a batch job runs a recipe, with --sbatch")
    recipe, wanted, asked = request.recipe, request.recipe.slurm, request.sbatch
    return batch_request(
        job_id=job_id,
        name=f"orch-{recipe.name}",
        nodes=request.hosts.nodes,
        ntasks_per_node=request.spec.nproc_per_node,  # --nproc-per-node, else the recipe's
        gpus_per_node=asked.gpus_per_node or wanted.gpus_per_node,
        workdir=request.spec.workdir or cwd,
        output=output,
        command=command,
        time=asked.time or wanted.time,
        partition=asked.partition or wanted.partition,
        account=wanted.account,
        no_kill=request.max_restarts > 0,
        warn_before=min(_SIGNAL_MAX_S, int(request.spec.stop.grace + SLURM_STOP_MARGIN_S)),
        requeue=request.requeue_settings.requeue,
    )


def submit_argv(request: JobRequest, *, python: str, recipe: str, job_id: str,
                runs_dir: str) -> tuple[str, ...]:  # fmt: skip
    """The orch command the batch script runs: the request's own submit, naming the job, on
    the allocation's nodes (--slurm), as many as the allocation asks for (--nodes given on the
    head wins over the recipe's, inside too). Otherwise only what was given is passed on: the
    recipe says the rest again, and the options given over it win again."""
    argv = [python, "-m", "orchestrator", "submit", recipe, "--slurm", "--job-id", job_id,
            "--runs-dir", runs_dir]  # fmt: skip
    if request.hosts.nodes is not None:  # the allocation's size, --nodes or the recipe's
        argv += ["--nodes", str(request.hosts.nodes)]
    watch = request.watch
    switches = (("--no-doctor", not watch.preflight), ("--sync", watch.sync),
                ("--keep-remote-logs", watch.keep_remote_logs),
                ("--push-env", watch.push_env))  # fmt: skip
    argv += [flag for flag, given in switches if given]
    if request.requeue.requeue:
        argv.append("--requeue")
    values = (("--heartbeat-timeout", watch.heartbeat_timeout),
              ("--hang-timeout", watch.hang_timeout), ("--main-port", request.main_port),
              ("--fanout", request.fanout),
              ("--max-restarts", request.recovery.max_restarts),
              ("--restart-on", request.recovery.restart_on),
              ("--min-nodes", request.recovery.min_nodes),
              ("--stop-signal", watch.stop_signal), ("--stop-grace", watch.stop_grace),
              ("--name", request.spec.name if request.spec.name != _recipe_name(request)
               else None),
              ("--time-limit", watch.time_limit),
              ("--checkpoint-dir", request.checkpoints.dir),
              ("--checkpoint-copies", request.checkpoints.copies),
              ("--checkpoint-bandwidth", request.checkpoints.bandwidth),
              ("--max-requeues", request.requeue.max_requeues))  # fmt: skip
    for option, value in values:
        if value is not None:
            argv += [option, f"{value}"]
    argv += _overrides_argv(request)
    for name in request.env_keep:
        argv += ["--env-keep", name]
    if request.extra_args:
        argv += ["--", *request.extra_args]
    return tuple(argv)


def _recipe_name(request: JobRequest) -> str | None:
    return request.recipe.name if request.recipe is not None else None


def _overrides_argv(request: JobRequest) -> list[str]:
    """Launch's options given over the recipe, passed on. An --env value is not: the batch
    script and the inner orch's arguments are readable by others; sbatch passes the
    submitting environment on, so a forwarded --env NAME is."""
    given = request.overrides
    argv: list[str] = []
    for option, value in (("--launcher", given.launcher),
                          ("--nproc-per-node", given.nproc_per_node),
                          ("--python", given.python), ("--workdir", given.workdir)):  # fmt: skip
        if value is not None:
            argv += [option, f"{value}"]
    for pair in given.env:
        name, sep, _ = pair.partition("=")
        if sep:
            raise UsageError(
                f"--sbatch: --env {name}=... would write the value into the batch script",
                f"export {name}=... here and give --env {name} (sbatch passes the "
                "environment on), or set it in the recipe's env:",
            )
        argv += ["--env", name]
    return argv


def render_batch_script(request: BatchRequest) -> str:
    """The script sbatch runs on the allocation's first node. One task per rank is asked
    for, so SLURM_TASKS_PER_NODE tells the inner orch the ranks per node."""
    lines = [
        "#!/bin/sh",
        f"# orch job {request.job_id}: written by `orch submit --sbatch`.",
        f"#SBATCH --job-name={request.name}",
        f"#SBATCH --nodes={request.nodes}",
        f"#SBATCH --ntasks-per-node={request.ntasks_per_node}",
        f"#SBATCH --chdir={request.workdir}",
        f"#SBATCH --output={request.output}",
    ]
    if request.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={request.gpus_per_node}")
    for option, value in (("time", request.time), ("partition", request.partition),
                          ("account", request.account)):  # fmt: skip
        if value:
            lines.append(f"#SBATCH --{option}={value}")
    if request.no_kill:
        lines.append("#SBATCH --no-kill")
    if request.warn_before:
        lines.append(f"#SBATCH --signal=B:USR1@{request.warn_before}")
    if request.requeue:
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    lines.append("exec " + " ".join(shlex.quote(word) for word in request.command))
    return "\n".join(lines) + "\n"
