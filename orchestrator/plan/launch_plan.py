"""A launch as a value: what orch will write and run, before anything runs.

Pure. `plan/build.py` makes a frozen `LaunchPlan` from a request's `LaunchSpec`, where the
job runs (`Placement`) and what the head is (`HeadContext`, its environment included):
the small spec every launcher reads (`JobShape`), then one module per launcher
(plan/launchers/) makes its `Launch` of it, the files and command lines.
`--dry-run` prints it (plan/describe.py); `orchestrator.run.launch` executes it.

Every launcher starts `orch-rank` (remote/rank.py) in place of the script, through its
own `--no_python` option. The rank's command (`rank_command`: interpreter, script, the
user's arguments) and the job's environment are in `node_private`, a file orch writes on
every node before the launch (readable by the user only), on no command line orch runs.
The rank itself runs with the user's arguments as its argv, which every user of the node can
read: the CLI warns of arguments that look like secrets (specs/secret_args.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.plan.agent_command import agent_argv, agent_command
from orchestrator.plan.pdsh_command import build_pdsh_argv, job_window, pdsh_environment
from orchestrator.plan.srun_command import LINGER_S, build_srun_argv
from orchestrator.remote.agent_spec import AgentSpec
from orchestrator.specs.checkpoints import CheckpointSettings
from orchestrator.specs.constants import STOP_GRACE_S, Transport
from orchestrator.specs.inventory import Hostfile
from orchestrator.specs.jobenv import REDACTED, is_secret, looks_like_token
from orchestrator.specs.recipe import AccelerateOptions
from orchestrator.specs.stop import StopSettings
from orchestrator.specs.words import Fanout, StrEnum

HEAD_LAUNCHER_NAME = "accelerate_head.py"  # the pdsh and standard launchers' config writer



class Destination(StrEnum):
    """Where a planned file goes."""

    RECORD = "record"  # kept in runs/<id>/
    PRIVATE = "private"  # the job's private directory on the head, removed when it ends
    NODE = "node"  # kept in the record, and sent to every node in the agent's spec


@dataclass(frozen=True)
class PlannedFile:
    """A file the launch writes, `where` its Destination: the job's record, the job's
    private directory on the head (secrets, the shim), or the record and every node (the
    agent writes it to the node's directory)."""

    name: str
    content: str
    where: Destination = Destination.RECORD
    mode: int = 0o644

    @property
    def run_dir(self) -> bool:
        return self.where in (Destination.RECORD, Destination.NODE)

    @property
    def ship(self) -> bool:
        return self.where == Destination.NODE


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
    # The head's environment: what the job may forward, what pdsh runs in.
    environ: Mapping[str, str] = field(default_factory=dict)
    # In the job's private settings, so that their hash on the agent's command line (which
    # every user of a node can read) says nothing of them: the rest is mostly guessable, a
    # weak secret would fall to trying values offline. One per job: its plan, built again
    # with the chosen port, keeps the same settings.
    private_nonce: str = field(default_factory=lambda: secrets.token_hex(16))


@dataclass(frozen=True)
class Placement:
    """Where and as what a job runs: its id, hosts, record and main port, and what starts
    its nodes (a Fanout word, checked when the plan is built) in which Slurm allocation."""

    job_id: str
    hostfile: Hostfile
    run_dir: str  # runs/<id>/ on the head
    main_port: int
    main_port_chosen: bool = False  # picked by orch (free on node 0), not given
    fanout: str = Fanout.PDSH
    slurm_job: str = ""  # the Slurm allocation the job runs in, if any
    slurm_batch: bool = False  # that allocation is the job's own (orch submit --sbatch)
    transport: Transport = Transport.SSH  # how orch's own commands reach the nodes
    restart_count: int = 0  # the attempt: 0 first, then one more after each restart


@dataclass(frozen=True)
class JobShape:
    """The small spec each launcher's module builds its part of the plan from: the request
    resolved on its hosts and head."""

    job_id: str
    launcher: str
    hostfile: Hostfile
    ranks_per_node: tuple[int, ...]  # per node, in order (uneven on torchrun only)
    script: str
    args: tuple[str, ...]
    python: str
    workdir: str
    main_port: int
    env: Mapping[str, str]  # the job's environment on every node (ORCH_JOB_ID included)
    run_dir: str
    private_dir: str  # the job's private directory on the head (its PRIVATE files)
    grace: float = STOP_GRACE_S  # TERM -> KILL on each node
    fanout: Fanout = Fanout.PDSH
    slurm_job: str = ""
    accelerate: AccelerateOptions = field(default_factory=AccelerateOptions)
    torchrun_args: tuple[str, ...] = ()
    rdzv_id: str = ""  # torchrun's rendezvous id
    private_nonce: str = ""  # HeadContext's: in node_private, never on a command line
    node_root: str = ""  # the user's ORCH_NODE_ROOT: orch's directory on each node ("": its own)
    stop: StopSettings = field(default_factory=StopSettings)  # the ranks' stop signal, grace
    # --checkpoint-dir (absolute) and how orch copies what is there; None: left alone
    checkpoints: CheckpointSettings | None = None

    @property
    def nproc(self) -> int:
        """Ranks per node where they are the same (the most, where not)."""
        return max(self.ranks_per_node)

    @property
    def rank_command(self) -> tuple[str, ...]:
        """What every rank runs, exactly as typed (orch-rank starts it)."""
        return (self.python, self.script, *self.args)


@dataclass(frozen=True)
class Launch:
    """What a launcher's module makes of a JobShape: its files, what the head starts, what
    each node's agent runs."""

    files: tuple[PlannedFile, ...]
    agent_spec: AgentSpec  # what every node's agent gets
    head_process: HeadProcess  # what the head starts
    head_command: tuple[str, ...] = ()  # pdsh launcher: run on the head
    node_command: tuple[str, ...] = ()  # standard/torchrun: run by the agent on each node
    wait_for_main: bool = False  # workers wait until node 0's main port answers
    node_commands: tuple[tuple[str, ...], ...] = ()  # per node rank, when they differ


@dataclass(frozen=True)
class LaunchPlan:
    job: JobShape
    launch: Launch
    files: tuple[PlannedFile, ...]  # the hostfile, then the launcher's
    node_private: str  # JSON: the job's env and the rank's argv, written on every node
    forwarded: tuple[str, ...] = ()  # names whose value came from the head's environment
    given: tuple[str, ...] = ()  # names the user set (--env NAME=VALUE, a recipe's env)
    kept: tuple[str, ...] = ()  # shown though their values read as tokens (--env-keep)
    main_port_chosen: bool = False  # picked by orch (free on node 0), not given
    slurm_batch: bool = False  # the job's Slurm allocation is its own (orch submit --sbatch)
    recipe: str | None = None
    name: str | None = None  # what the user calls the job
    transport: Transport = Transport.SSH  # how orch's own commands reach the nodes

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def launcher(self) -> str:
        return self.job.launcher

    @property
    def hostfile(self) -> Hostfile:
        return self.job.hostfile

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.job.hostfile.names

    @property
    def main_host(self) -> str:
        return self.job.hostfile.names[0]

    @property
    def main_port(self) -> int:
        return self.job.main_port

    @property
    def python(self) -> str:
        return self.job.python

    @property
    def workdir(self) -> str:
        return self.job.workdir

    @property
    def world_size(self) -> int:
        return sum(self.job.ranks_per_node)

    @property
    def checkpoints(self) -> CheckpointSettings | None:
        """Where the job writes its checkpoints (the same absolute path on every node) and
        how orch copies them; None: the job was not given --checkpoint-dir."""
        return self.job.checkpoints

    @property
    def shape_text(self) -> str:
        """"3 nodes x 2 ranks", or "3 nodes (2+1+2 ranks)" when they differ."""
        counts = self.job.ranks_per_node
        if len(set(counts)) > 1:
            return f"{len(counts)} nodes ({'+'.join(map(str, counts))} ranks)"
        return f"{len(counts)} nodes x {counts[0]} ranks"

    def command_of(self, node_rank: int) -> tuple[str, ...]:
        """What the agent on this node runs (standard and torchrun)."""
        launch = self.launch
        return launch.node_commands[node_rank] if launch.node_commands else launch.node_command

    @property
    def secret_names(self) -> frozenset[str]:
        """Variables whose values never reach a record, a dry run or a log: secret by name
        (HF_TOKEN, DB_PASS), forwarded from the head's environment (a DATABASE_URL the user
        did not type), or a value that reads as a token, unless kept (--env-keep)."""
        kept = set(self.kept)
        return frozenset(
            name for name, value in self.job.env.items()
            if is_secret(name) or name in self.forwarded
            or (looks_like_token(value) and name not in kept)
        )  # fmt: skip

    @property
    def redacted_env(self) -> dict[str, str]:
        """The job's environment as records and dry runs show it: secrets (secret_names) are
        ***, the rest (NCCL_DEBUG, CUDA_VISIBLE_DEVICES) show as they are."""
        hidden = self.secret_names
        return {name: REDACTED if name in hidden else value for name, value in self.job.env.items()}

    @property
    def command(self) -> tuple[str, ...]:
        """The resolved command to record and show."""
        return self.launch.head_command or self.launch.node_command

    def file(self, name: str) -> PlannedFile:
        for planned in self.files:
            if planned.name == name:
                return planned
        raise KeyError(name)

    def file_path(self, planned: PlannedFile) -> str:
        """Where a planned file lives on the head."""
        base = self.job.private_dir if planned.where == Destination.PRIVATE else self.job.run_dir
        return f"{base}/{planned.name}"


def node_private_text(job: JobShape) -> str:
    """What orch writes on every node before the launch: the job's environment (secrets
    included), the rank's exact command and the job's nonce. The agent reads it, checks its
    hash, and removes it; nothing of it is on a command line, and the hash, which is, cannot
    be matched by guessing the rest without the nonce."""
    private: dict[str, object] = {"env": dict(job.env), "rank_argv": list(job.rank_command)}
    if job.private_nonce:
        private["nonce"] = job.private_nonce
    return json.dumps(private, sort_keys=True)


def agent_spec(
    job: JobShape,
    node_files: Sequence[PlannedFile],
    wait_for_main: bool,
    node_command: tuple[str, ...] = (),
    per_node: tuple[tuple[str, ...], ...] = (),
) -> AgentSpec:
    """What every node's agent gets on its command line: no value of the job's environment,
    no word the user typed. It runs `node_command`, or its node rank's command of
    `per_node` when the nodes' differ (none on the pdsh launcher: the shim adds it)."""
    private = node_private_text(job)
    srun = job.fanout == Fanout.SRUN
    return AgentSpec(
        job_id=job.job_id,
        workdir=job.workdir,
        grace=job.grace,
        files=tuple((f.name, f.content) for f in node_files),
        private_sha256=hashlib.sha256(private.encode()).hexdigest(),
        wait_for=(job.hostfile.names[0], job.main_port) if wait_for_main else None,
        main_port=job.main_port,  # every launcher's rendezvous is there, on node 0
        command=node_command,
        commands=per_node,
        # srun prints its tasks' lines as they come: each agent names its node on every
        # line, as pdsh would, and finds its node rank by its Slurm node name.
        hosts=tuple(job.hostfile.names) if srun else (),
        label_lines=srun,
        linger_s=LINGER_S if srun else 0.0,
        node_root=job.node_root,
    )


def node_side(
    job: JobShape,
    node_command: tuple[str, ...],
    node_files: tuple[PlannedFile, ...],
    *,
    wait_for_main: bool,
    pdsh: str,
    environ: Mapping[str, str],
    per_node: tuple[tuple[str, ...], ...] = (),
) -> Launch:
    """standard and torchrun: orch's pdsh runs the agent on every node, which runs
    `node_command`, or its node rank's command of `per_node` when the nodes' differ."""
    spec = agent_spec(job, node_files, wait_for_main, node_command, per_node)
    if job.fanout == Fanout.SRUN:
        argv = build_srun_argv(
            job.hostfile.names,
            agent_argv(job.python, spec),
            slurm_job=job.slurm_job,
            job_id=job.job_id,
            environ=environ,
        )
        head = HeadProcess(argv=tuple(argv), cwd=job.workdir, term_first=True)
    else:
        argv = build_pdsh_argv(
            job.hostfile.names,
            agent_command(job.python, spec),
            window=job_window(len(job.hostfile.hosts)),
            pdsh=pdsh,
        )
        head = HeadProcess(argv=tuple(argv), cwd=job.workdir, set_env=pdsh_variables(environ))
    return Launch(
        files=node_files, agent_spec=spec, head_process=head, node_command=node_command,
        wait_for_main=wait_for_main, node_commands=per_node,
    )  # fmt: skip


def pdsh_variables(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables pdsh_environment adds or changes in the head's environment."""
    env = pdsh_environment(environ)
    return tuple((k, v) for k, v in env.items() if environ.get(k) != v)


