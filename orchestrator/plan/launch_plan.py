"""A launch as a value: what orch will write and run, before anything runs.

Pure: builds a frozen `LaunchPlan` from CLI options or a recipe plus a hostfile.
`--dry-run` prints it (`plan_summary`); `orchestrator.run.launch` executes it.

Launchers:
- pdsh: the head runs `accelerate launch --config_file <pdsh config>` (after writing
  that config, in the same process: accelerate_head.py); DeepSpeed's runner fans
  out with pdsh (orch's shim wraps each node's launcher in the agent).
- standard: every node runs `accelerate launch` with its own machine-rank config,
  through pdsh and the agent; workers start once the main port answers.
- torchrun: every node runs torchrun with c10d rendezvous at node 0.

Every launcher starts `orch-rank` (remote/rank.py) in place of the script, through its
own `--no_python` option. The rank's command (`rank_command`: interpreter, script, the
user's arguments) and the job's environment are in `node_private`, a file orch writes on
every node before the launch (readable by the user only), never on a command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from orchestrator.errors import UsageError
from orchestrator.plan.accel_config import cluster_config_fields, config_header
from orchestrator.plan.agent_command import agent_argv, agent_command
from orchestrator.plan.pdsh_command import (
    SHIM_CONFIG_NAME,
    SHIM_NAME,
    build_pdsh_argv,
    job_fanout,
    pdsh_environment,
    shim_script,
)
from orchestrator.plan.request import LaunchSpec
from orchestrator.plan.srun_command import LINGER_S, build_srun_argv
from orchestrator.remote import program_source
from orchestrator.remote.agent import RANK_PROGRAM
from orchestrator.specs.constants import (
    DEFAULT_LAUNCHER,
    DEFAULT_MAIN_PORT,
    HOSTFILE_NAME,
    NODE_DIR_VAR,
    NODE_RANK_VAR,
    PDSH_CONFIG_NAME,
    STOP_GRACE_S,
    standard_config_name,
)
from orchestrator.specs.inventory import Hostfile, ranks_per_node, render_hostfile, slot_listing
from orchestrator.specs.jobenv import REDACTED, build_job_env, is_secret
from orchestrator.specs.options import check_launcher, check_port
from orchestrator.specs.recipe import AccelerateOptions

PDSH_SPEC_NAME = "accelerate_config.json"  # ClusterConfig fields the head launcher renders
HEAD_LAUNCHER_NAME = "accelerate_head.py"
SHIM_DIR = "bin"  # in the private directory, first on the head launcher's PATH

RECORD, PRIVATE, NODE = "record", "private", "node"
FANOUTS = ("pdsh", "srun")  # what starts the node side: pdsh over ssh, or one Slurm step


@dataclass(frozen=True)
class PlannedFile:
    """A file the launch writes. `where`: RECORD, kept in runs/<id>/; PRIVATE, in the
    job's private directory on the head (secrets, the shim), removed when the job ends;
    NODE, kept in the record and sent to every node in the agent's spec, which writes it
    to the node's directory."""

    name: str
    content: str
    where: str = RECORD
    mode: int = 0o644

    @property
    def run_dir(self) -> bool:
        return self.where in (RECORD, NODE)

    @property
    def ship(self) -> bool:
        return self.where == NODE


@dataclass(frozen=True)
class HeadProcess:
    """The one process the head starts for a job (pdsh, or the head's accelerate launch
    that runs pdsh through DeepSpeed), with everything about its environment: the head's
    own environment, minus `drop_env`, plus `set_env`, with `path_prepend` first on PATH."""

    argv: tuple[str, ...]
    cwd: str
    set_env: tuple[tuple[str, str], ...] = ()
    drop_env: tuple[str, ...] = ()
    path_prepend: tuple[str, ...] = ()
    # srun: TERMed first if orch dies, which it forwards to its step (KILL would not end it).
    term_first: bool = False


def process_environment(head: HeadProcess, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment `head` runs in, from the head's own."""
    env = {name: value for name, value in environ.items() if name not in head.drop_env}
    env.update(head.set_env)
    if head.path_prepend:
        env["PATH"] = os.pathsep.join([*head.path_prepend, env.get("PATH", "")])
    return env


@dataclass(frozen=True)
class HeadContext:
    """What a plan needs to know of the head it is built on."""

    pdsh: str  # the real pdsh
    private_dir: str  # the job's private directory (created when the job starts)
    orch_python: str  # the interpreter orch runs on (the pdsh shim's, the ranks' by default)
    cwd: str = ""  # orch's working directory (the job's, unless one is given)


@dataclass(frozen=True)
class LaunchPlan:
    job_id: str
    launcher: str
    hostfile: Hostfile
    nproc_per_node: int
    script: str
    args: tuple[str, ...]
    python: str
    workdir: str
    main_port: int
    env: tuple[tuple[str, str], ...]  # the job's environment on every node (ORCH_JOB_ID included)
    files: tuple[PlannedFile, ...]
    run_dir: str  # runs/<id>/ on the head
    private_dir: str  # the job's private directory on the head (PRIVATE files)
    agent_spec: Mapping[str, object]  # what every node's agent gets (never mutated)
    fanout: HeadProcess  # what the head starts
    head_command: tuple[str, ...] = ()  # pdsh launcher: run on the head
    node_command: tuple[str, ...] = ()  # standard/torchrun: run by the agent on each node
    wait_for_main: bool = False  # workers wait until node 0's main port answers
    grace: float = STOP_GRACE_S  # TERM -> KILL on each node
    recipe: str | None = None
    main_port_chosen: bool = False  # picked by orch (free on node 0), not given
    ranks_per_node: tuple[int, ...] = ()  # per node, in order (uneven on torchrun)
    node_commands: tuple[tuple[str, ...], ...] = ()  # per node rank, when they differ
    node_private: str = ""  # JSON: the job's env and the rank's argv, written on every node
    fanout_kind: str = "pdsh"  # FANOUTS
    slurm_job: str = ""  # the Slurm allocation the job runs in, if any
    slurm_batch: bool = False  # that allocation is the job's own (orch submit --sbatch)

    @property
    def rank_command(self) -> tuple[str, ...]:
        """What every rank runs, exactly as typed (orch-rank starts it)."""
        return (self.python, self.script, *self.args)

    @property
    def world_size(self) -> int:
        return sum(self.ranks_per_node) or self.nproc_per_node * len(self.hostfile.hosts)

    @property
    def shape_text(self) -> str:
        """"3 nodes x 2 ranks", or "3 nodes (2+1+2 ranks)" when they differ."""
        counts = self.ranks_per_node or (self.nproc_per_node,) * len(self.hosts)
        if len(set(counts)) > 1:
            return f"{len(counts)} nodes ({'+'.join(map(str, counts))} ranks)"
        return f"{len(counts)} nodes x {counts[0]} ranks"

    def command_of(self, node_rank: int) -> tuple[str, ...]:
        """What the agent on this node runs (standard and torchrun)."""
        return self.node_commands[node_rank] if self.node_commands else self.node_command

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.hostfile.names

    @property
    def main_host(self) -> str:
        return self.hostfile.names[0]

    forwarded: tuple[str, ...] = ()  # names whose value came from the head's environment

    @property
    def secret_names(self) -> frozenset[str]:
        """Variables whose values never reach a record or a log: secret by name, or forwarded
        from the head's environment (a DATABASE_URL with a password is not caught by name)."""
        return frozenset(n for n, _v in self.env if is_secret(n) or n in self.forwarded)

    @property
    def redacted_env(self) -> dict[str, str]:
        secret = self.secret_names
        return {name: REDACTED if name in secret else value for name, value in self.env}

    @property
    def command(self) -> tuple[str, ...]:
        """The resolved command to record and show."""
        return self.head_command or self.node_command

    def file(self, name: str) -> PlannedFile:
        for planned in self.files:
            if planned.name == name:
                return planned
        raise KeyError(name)

    def file_path(self, planned: PlannedFile) -> str:
        """Where a RECORD, NODE or PRIVATE file lives on the head."""
        base = self.private_dir if planned.where == PRIVATE else self.run_dir
        return f"{base}/{planned.name}"


def _check_launch_inputs(launcher: str, hostfile: Hostfile, script: str, main_port: int) -> None:
    check_launcher(launcher)
    if not hostfile.hosts:
        raise UsageError(f"{hostfile.source or 'hostfile'}: no hosts", "add `host slots=N` lines")
    if not script:
        raise UsageError("no training script given", "orch launch --hostfile F SCRIPT [ARGS...]")
    check_port(main_port)


def _script_path(script: str, workdir: str) -> str:
    return script if PurePosixPath(script).is_absolute() else str(PurePosixPath(workdir) / script)


def build_plan(
    *,
    job_id: str,
    hostfile: Hostfile,
    script: str,
    args: Sequence[str] = (),
    launcher: str = DEFAULT_LAUNCHER,
    python: str,
    workdir: str,
    run_dir: str,
    main_port: int = DEFAULT_MAIN_PORT,
    nproc_per_node: int | None = None,
    extra_env: Mapping[str, str] | None = None,
    passthrough: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    accelerate: AccelerateOptions | None = None,
    torchrun_args: Sequence[str] = (),
    rdzv_id: str | None = None,
    recipe: str | None = None,
    head: HeadContext | None = None,
    grace: float = STOP_GRACE_S,
    main_port_chosen: bool = False,
    fanout: str = "pdsh",
    slurm_job: str = "",
    slurm_batch: bool = False,
) -> LaunchPlan:
    """Everything a launch does, decided up front. `run_dir` is where its files will live;
    `environ` is the head's environment (what the job may forward, what pdsh runs in), as
    the caller read it: none, when not given;
    `head` what the plan needs to know of the head (run.pipeline.head_context)."""
    _check_launch_inputs(launcher, hostfile, script, main_port)
    _check_fanout(fanout, launcher, slurm_job)
    environ = environ if environ is not None else {}
    head = head or HeadContext("pdsh", f"/tmp/orch-{job_id}", sys.executable)
    counts = ranks_per_node(hostfile, nproc_per_node)
    _check_uneven(hostfile, counts, launcher)
    nproc = max(counts)
    passthrough = tuple(passthrough)
    env = build_job_env(job_id, extra_env or {}, passthrough, environ)
    job = _JobShape(
        job_id=job_id, hostfile=hostfile, nproc=nproc, script=script, args=tuple(args),
        python=python, workdir=workdir, main_port=main_port, env=env, run_dir=run_dir,
        private_dir=head.private_dir, grace=grace, fanout=fanout, slurm_job=slurm_job,
    )  # fmt: skip
    options = accelerate if accelerate is not None else AccelerateOptions()
    if launcher == "torchrun":
        commands = tuple(
            _torchrun_command(job, count, torchrun_args, rdzv_id or job_id) for count in counts
        )
        shape = _node_side(
            job, commands[0], (), wait_for_main=False, pdsh=head.pdsh, environ=environ,
            per_node=commands if len(set(counts)) > 1 else (),
        )  # fmt: skip
    elif launcher == "standard":
        node_files = _standard_node_files(options, hostfile, nproc, main_port)
        node_command = _standard_command(job)
        shape = _node_side(
            job, node_command, node_files, wait_for_main=True, pdsh=head.pdsh, environ=environ
        )
    else:
        shape = _head_side(
            job, options, pdsh=head.pdsh, environ=environ, orch_python=head.orch_python
        )
    return LaunchPlan(
        job_id=job_id,
        launcher=launcher,
        hostfile=hostfile,
        nproc_per_node=nproc,
        script=script,
        args=tuple(args),
        python=python,
        workdir=workdir,
        main_port=main_port,
        env=tuple(env.items()),
        files=(PlannedFile(HOSTFILE_NAME, render_hostfile(hostfile)), *shape.files),
        run_dir=run_dir,
        private_dir=job.private_dir,
        agent_spec=shape.agent_spec,
        fanout=shape.fanout,
        head_command=shape.head_command,
        node_command=shape.node_command,
        wait_for_main=shape.wait_for_main,
        grace=grace,
        recipe=recipe,
        main_port_chosen=main_port_chosen,
        ranks_per_node=counts,
        node_commands=shape.node_commands,
        node_private=node_private_text(env, (python, script, *args)),
        forwarded=tuple(name for name in passthrough if name in env),
        fanout_kind=fanout,
        slurm_job=slurm_job,
        slurm_batch=slurm_batch,
    )


def _check_fanout(fanout: str, launcher: str, slurm_job: str) -> None:
    if fanout not in FANOUTS:
        raise UsageError(f"unknown fan-out {fanout!r}", f"choose one of: {', '.join(FANOUTS)}")
    if fanout != "srun":
        return
    if not slurm_job:
        raise UsageError(
            "--fanout srun runs inside a Slurm allocation, and there is none",
            "run inside `salloc`/`sbatch` (SLURM_JOB_ID set), or use --fanout pdsh",
        )
    if launcher == "pdsh":
        raise UsageError(
            "--fanout srun starts orch's agent on every node, but the pdsh launcher's nodes "
            "are started by DeepSpeed's runner (through pdsh)",
            "use --launcher standard or torchrun with srun, or --fanout pdsh",
        )


def _check_uneven(hostfile: Hostfile, counts: Sequence[int], launcher: str) -> None:
    """Nodes with different slot counts run as they are on torchrun (each node's agent
    starts its own count; c10d numbers the ranks). accelerate's launchers start the same
    number everywhere (num_processes // num_machines): refused, never run short."""
    if len(set(counts)) == 1 or launcher == "torchrun":
        return
    where = hostfile.source or "the hostfile"
    raise UsageError(
        f"hosts of {where} have different slot counts ({slot_listing(hostfile)}): the "
        f"{launcher} launcher "
        "starts the same number of ranks on every node (accelerate divides num_processes by "
        "num_machines), so some slots would stay idle",
        hint=f"--launcher torchrun runs each node's own count ({sum(counts)} ranks in all); "
        f"or --nproc-per-node N runs N on every node (at most {min(counts)} here)",
    )


@dataclass(frozen=True)
class _JobShape:
    """The values every launcher's plan is built from."""

    job_id: str
    hostfile: Hostfile
    nproc: int
    script: str
    args: tuple[str, ...]
    python: str
    workdir: str
    main_port: int
    env: Mapping[str, str]
    run_dir: str
    private_dir: str
    grace: float
    fanout: str = "pdsh"
    slurm_job: str = ""


@dataclass(frozen=True)
class _LauncherShape:
    """What differs between launchers: files, what the head starts, what nodes run."""

    files: tuple[PlannedFile, ...]
    agent_spec: Mapping[str, object]
    fanout: HeadProcess
    head_command: tuple[str, ...] = ()
    node_command: tuple[str, ...] = ()
    wait_for_main: bool = False
    node_commands: tuple[tuple[str, ...], ...] = ()


def node_private_text(job_env: Mapping[str, str], rank_argv: Sequence[str]) -> str:
    """What orch writes on every node before the launch: the job's environment (secrets
    included) and the rank's exact command. The agent reads it, checks its hash, and removes
    it; nothing of it is on a command line."""
    return json.dumps({"env": dict(job_env), "rank_argv": list(rank_argv)}, sort_keys=True)


def _agent_spec(job: _JobShape, node_files: Sequence[PlannedFile], wait_for_main: bool) -> dict:
    """What every node's agent gets on its command line, apart from the command it runs:
    no value of the job's environment, no word the user typed."""
    private = node_private_text(job.env, (job.python, job.script, *job.args))
    spec: dict = {
        "job_id": job.job_id,
        "workdir": job.workdir,
        "grace": job.grace,
        "files": {f.name: f.content for f in node_files},
        "private_sha256": hashlib.sha256(private.encode()).hexdigest(),
    }
    if wait_for_main:
        spec["wait_for"] = [job.hostfile.names[0], job.main_port]
    return spec


def _torchrun_command(
    job: _JobShape, nproc: int, extra: Sequence[str], rdzv_id: str
) -> tuple[str, ...]:
    return (
        job.python, "-m", "torch.distributed.run",
        f"--nnodes={len(job.hostfile.hosts)}",
        f"--nproc_per_node={nproc}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={job.hostfile.names[0]}:{job.main_port}",
        f"--rdzv_id={rdzv_id}",
        *extra,
        "--no-python", RANK_PROGRAM,
    )  # fmt: skip


def standard_spec_name(machine_rank: int | str) -> str:
    """The ClusterConfig fields of one machine's config, which the node renders itself."""
    return f"accelerate-rank{machine_rank}.json"


def _standard_command(job: _JobShape) -> tuple[str, ...]:
    # Each node writes its own machine-rank config with accelerate's ClusterConfig (the head
    # launcher program, run on the node), then runs `accelerate launch` in that process.
    node_dir, rank = f"${NODE_DIR_VAR}", f"${NODE_RANK_VAR}"
    launcher = f'"{node_dir}/{HEAD_LAUNCHER_NAME}"'
    spec = f'"{node_dir}/{standard_spec_name(rank)}"'
    config = f'"{node_dir}/{standard_config_name(rank)}"'
    shell = (
        f"exec {shlex.quote(job.python)} {launcher} {spec} --config_file {config} "
        f"--no_python {RANK_PROGRAM}"
    )
    return ("/bin/sh", "-c", shell)


def _node_side(
    job: _JobShape,
    node_command: tuple[str, ...],
    node_files: tuple[PlannedFile, ...],
    *,
    wait_for_main: bool,
    pdsh: str,
    environ: Mapping[str, str],
    per_node: tuple[tuple[str, ...], ...] = (),
) -> _LauncherShape:
    """standard and torchrun: orch's pdsh runs the agent on every node, which runs
    `node_command`, or its node rank's command of `per_node` when the nodes' differ."""
    spec = {**_agent_spec(job, node_files, wait_for_main), "command": list(node_command)}
    if per_node:
        spec["commands"] = [list(command) for command in per_node]
    if job.fanout == "srun":
        # srun prints its tasks' lines as they come: each agent names its node on every line,
        # as pdsh would, and finds its node rank by its Slurm node name.
        spec = {**spec, "hosts": list(job.hostfile.names), "label_lines": True,
                "linger_s": LINGER_S}  # fmt: skip
        argv = build_srun_argv(
            job.hostfile.names,
            agent_argv(job.python, spec),
            slurm_job=job.slurm_job,
            job_id=job.job_id,
            environ=environ,
        )
        fanout = HeadProcess(argv=tuple(argv), cwd=job.workdir, term_first=True)
    else:
        argv = build_pdsh_argv(
            job.hostfile.names,
            agent_command(job.python, spec),
            fanout=job_fanout(len(job.hostfile.hosts)),
            pdsh=pdsh,
        )
        fanout = HeadProcess(argv=tuple(argv), cwd=job.workdir, set_env=_pdsh_variables(environ))
    return _LauncherShape(
        files=node_files, agent_spec=spec, fanout=fanout, node_command=node_command,
        wait_for_main=wait_for_main, node_commands=per_node,
    )  # fmt: skip


def _pdsh_variables(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables pdsh_environment adds or changes in the head's environment."""
    env = pdsh_environment(environ)
    return tuple((k, v) for k, v in env.items() if environ.get(k) != v)


def _head_side(
    job: _JobShape,
    options: AccelerateOptions,
    *,
    pdsh: str,
    environ: Mapping[str, str],
    orch_python: str,
) -> _LauncherShape:
    """pdsh launcher: the head runs `accelerate launch` (after writing its config), which
    runs DeepSpeed's runner, which runs pdsh: orch's shim, first on PATH, wraps each node's
    launcher in the agent and runs the real pdsh."""
    config_path = f"{job.run_dir}/{PDSH_CONFIG_NAME}"
    spec_path = f"{job.run_dir}/{PDSH_SPEC_NAME}"
    config_spec = _pdsh_config_spec(
        options, job.hostfile, job.nproc, job.main_port, config_path,
        f"{job.run_dir}/{HOSTFILE_NAME}",
    )  # fmt: skip
    head = (job.python, f"{job.run_dir}/{HEAD_LAUNCHER_NAME}", spec_path,
            "--config_file", config_path, "--no_python", RANK_PROGRAM)  # fmt: skip
    agent = _agent_spec(job, (), wait_for_main=False)
    shim_dir = f"{job.private_dir}/{SHIM_DIR}"
    shim_config = {"job_id": job.job_id, "python": job.python, "real_pdsh": pdsh, "agent": agent}
    files = (
        PlannedFile(HEAD_LAUNCHER_NAME, program_source("accelerate_head")),
        PlannedFile(PDSH_SPEC_NAME, json.dumps(config_spec, indent=2, sort_keys=True) + "\n"),
        PlannedFile(f"{SHIM_DIR}/{SHIM_CONFIG_NAME}", json.dumps(shim_config, indent=2) + "\n",
                    where=PRIVATE, mode=0o600),
        PlannedFile(f"{SHIM_DIR}/{SHIM_NAME}",
                    shim_script(f"{shim_dir}/{SHIM_CONFIG_NAME}", orch_python),
                    where=PRIVATE, mode=0o755),
    )  # fmt: skip
    # accelerate copies the head's whole environment into DeepSpeed's env file, whose lines
    # the runner exports on pdsh's command line: the file is /dev/null (not a regular file,
    # so the runner reads nothing back), and secret-named variables stay out of the head
    # launcher's environment. The job's own variables reach the nodes in node_private.
    dropped = tuple(sorted(name for name in environ if is_secret(name)))
    set_env = {**dict(_pdsh_variables(environ)), "DS_ENV_FILE": os.devnull}
    fanout = HeadProcess(
        argv=head,
        cwd=job.workdir,
        set_env=tuple(set_env.items()),
        drop_env=dropped,
        # DeepSpeed finds `pdsh` (orch's shim) and `deepspeed` on PATH.
        path_prepend=(shim_dir, str(PurePosixPath(job.python).parent)),
    )
    return _LauncherShape(files=files, agent_spec=agent, fanout=fanout, head_command=head)


def _pdsh_config_spec(
    options: AccelerateOptions,
    hostfile: Hostfile,
    nproc: int,
    port: int,
    config_path: str,
    hostfile_path: str,
) -> dict[str, object]:
    """What the head's launcher needs to write the pdsh config (accelerate_head.py)."""
    fields = cluster_config_fields(
        options,
        hosts=hostfile,
        nproc_per_node=nproc,
        main_ip=hostfile.names[0],
        main_port=port,
        launcher="pdsh",
        hostfile_path=hostfile_path,
    )
    header = config_header("pdsh", len(hostfile.hosts), nproc)
    return {"config_file": config_path, "header": header, "fields": fields}


def _standard_node_files(
    options: AccelerateOptions, hostfile: Hostfile, nproc: int, port: int
) -> tuple[PlannedFile, ...]:
    """The head launcher program and one config spec per machine rank, sent to every node:
    orch's own process never imports accelerate (nor torch under it) for them."""
    machines = len(hostfile.hosts)
    specs = []
    for rank in range(machines):
        fields = cluster_config_fields(
            options, hosts=hostfile, nproc_per_node=nproc, main_ip=hostfile.names[0],
            main_port=port, launcher="standard", hostfile_path=None, machine_rank=rank,
        )  # fmt: skip
        spec = {
            "config_file": standard_config_name(rank),  # beside the spec, on the node
            "header": config_header("standard", machines, nproc),
            "fields": fields,
        }
        text = json.dumps(spec, indent=2, sort_keys=True) + "\n"
        specs.append(PlannedFile(standard_spec_name(rank), text, where=NODE))
    launcher = PlannedFile(HEAD_LAUNCHER_NAME, program_source("accelerate_head"), where=NODE)
    return (launcher, *specs)


def plan_job(
    spec: LaunchSpec,
    *,
    job_id: str,
    hostfile: Hostfile,
    run_dir: str,
    head: HeadContext,
    environ: Mapping[str, str],
    main_port: int,
    main_port_chosen: bool,
    fanout: str = "pdsh",
    slurm_job: str = "",
    slurm_batch: bool = False,
) -> LaunchPlan:
    """A plan from a request's spec (plan/request.py) on `head`, whose interpreter and
    working directory stand in for those the spec leaves open; `main_port` resolved."""
    return build_plan(
        job_id=job_id,
        hostfile=hostfile,
        script=spec.script,
        args=spec.args,
        launcher=spec.launcher,
        python=spec.python or head.orch_python,
        workdir=spec.workdir or head.cwd,
        run_dir=run_dir,
        main_port=main_port,
        main_port_chosen=main_port_chosen,
        nproc_per_node=spec.nproc_per_node,
        extra_env=dict(spec.env),
        passthrough=spec.passthrough,
        environ=environ,
        accelerate=spec.accelerate,
        torchrun_args=spec.torchrun_args,
        rdzv_id=spec.rdzv_id,
        recipe=spec.recipe,
        head=head,
        fanout=fanout,
        slurm_job=slurm_job,
        slurm_batch=slurm_batch,
    )
