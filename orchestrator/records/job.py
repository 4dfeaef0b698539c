"""Job records: `runs/<job-id>/` holds what was launched and how it ended.

`job.json` carries the id, state, command, launcher, hosts, per-node exit codes,
the first failure (node, rank, last lines), start and end times, and the head
process (pid and start time), so a job whose head died is shown as such rather
than as running. The directory also holds the hostfile and configs the job used,
the environment with secrets redacted (env.json), and logs/<node>.log: the names
are given here, and records/rundir.py opens them.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.outcome.explanation import Explanation
from orchestrator.outcome.rank_ends import RankEnd, RankOrder, Role, signal_name
from orchestrator.outcome.requeue import RequeueDecision
from orchestrator.outcome.states import FailureKind, JobState
from orchestrator.outcome.stop import StopSummary
from orchestrator.specs.checkpoints import CheckpointSettings
from orchestrator.specs.constants import SCHEMA_VERSION
from orchestrator.specs.slurm import ACTIVE_STATES as SLURM_ACTIVE_STATES
from orchestrator.specs.words import Fanout

RUNS_DIR_VAR = "ORCH_RUNS_DIR"
JOB_SCHEMA = "orch.job"  # job.json's schema name, beside SCHEMA_VERSION

# Every name orch gives in a run directory, here alone: RunDir's paths are made of them, and
# whatever writes or reads one of these files or folders takes its name from here.
JOB_FILE = "job.json"
ENV_FILE = "env.json"  # the job's environment, secrets redacted
LOGS_DIR = "logs"  # logs/<node>.log: every rank's output as the head received it
HEAD_NODE = "_head"  # what the fan-out itself printed (pdsh's or srun's own lines): no node prefix
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def log_file_name(node: str) -> str:
    """The file name of a node's log in logs/: the node name made safe for a path."""
    return (_SAFE_NAME.sub("_", node) or HEAD_NODE) + ".log"


NODES_DIR = "nodes"  # nodes/<node>/: the raw node-local logs pulled back at the end
STACKS_DIR = "stacks"  # stacks/<UTC time>.json: each `orch stacks` (and the teardown's)
ATTEMPTS_DIR = "attempts"  # attempts/<number>/: an earlier attempt's own files
REPORT_FILE = "report.html"
PROGRESS_FILE = "progress.jsonl"  # the ranks' progress samples
MOMENTS_FILE = "moments.jsonl"  # the job's moments for the report's timeline
PREFLIGHT_FILE = "preflight.json"  # the pre-flight's report
TEARDOWN_UNANSWERED_FILE = "teardown-unanswered.log"  # what nodes the teardown missed said
KILL_MARKER = "kill-requested"  # `orch kill` leaves it, so the head reports "killed"
STOP_MARKER = "stop-requested"  # `orch stop` leaves it: the head stops the job, ranks save
SBATCH_SCRIPT_FILE = "sbatch.sh"  # a batch job's script, as submitted
SBATCH_OUTPUT_FILE = "sbatch.out"  # a batch job's own output, as Slurm writes it
CHECKPOINTS_FILE = "checkpoints.json"  # the job's checkpoints: seen, copied, restored from

# States a record can hold (and QUEUED); HEAD_DIED is derived when reading a running record.
RUNNING_STATES = (JobState.STARTING, JobState.RUNNING, JobState.STOPPING)
FINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.INTERRUPTED,
                JobState.STOPPED)  # fmt: skip


@dataclass(frozen=True)
class FirstFailure:
    node: str
    rank: int | None
    exit_code: int | None
    reason: str
    last_lines: tuple[str, ...] = ()
    kind: FailureKind = FailureKind.RANK
    # The rank whose own Python traceback is the root cause, ranked above the cascades it
    # caused on other ranks (lost peers, watchdog aborts, the teardown's SIGTERM).
    root_cause_rank: int | None = None
    root_cause_node: str | None = None
    root_cause: str | None = None  # its exception line
    traceback: tuple[str, ...] = ()
    then: str | None = None  # "then 3 ranks failed after losing rank 3"
    hint: str | None = None  # what an end that is not the script's own error means


@dataclass(frozen=True)
class RankRecord:
    """One rank's end, as job.json keeps it: times on the head's clock (seconds since the
    epoch), and its role in the job's end (outcome/rank_ends.py's Role)."""

    node: str
    rank: int
    local_rank: int | None
    pid: int | None
    start: float | None
    end: float
    exit_code: int | None  # as a shell reports it: 128 + N for signal N; None: unseen
    signal: str | None  # the signal that ended it, by name
    role: Role
    seen: str = "keeper"  # "keeper": reported as it happened; "scan": seen late on the node
    maxrss_kb: int | None = None
    oom_kill: bool | None = None


def rank_records(ends: Collection[RankEnd], order: RankOrder | None) -> tuple[RankRecord, ...]:
    """Every rank's end as job.json keeps it, by rank, with its role."""
    roles = order.roles if order is not None else {}
    return tuple(
        RankRecord(
            node=end.node, rank=end.rank, local_rank=end.local_rank, pid=end.pid,
            start=None if end.start is None else round(end.start, 4), end=round(end.end, 4),
            exit_code=None if end.code is None else end.exit_code,
            signal=None if end.signal is None else signal_name(end.signal),
            role=roles.get(end.rank, Role.SUCCEEDED if not end.failed else Role.FAILED),
            seen="keeper" if end.exact else "scan",
            maxrss_kb=end.maxrss_kb, oom_kill=end.oom_kill,
        )
        for end in sorted(ends, key=lambda e: e.rank)
    )


@dataclass(frozen=True)
class EnvironmentRecord:
    """The Python environment every node ran the job with, by fingerprint (the probe's hash of
    the interpreter, its ABI, the platform and every distribution): as the pre-flight found
    it, after a push as the push left it. `reference`: the head's (None: the head has not the
    job's interpreter); a node's None: it gave no facts or has no such interpreter;
    `pushed`: the nodes the head's environment was pushed to first (--push-env), and the
    bytes the head sent."""

    reference: str | None
    nodes: Mapping[str, str | None]
    pushed: tuple[str, ...] = ()
    pushed_bytes: int = 0

    def to_json(self) -> dict:
        return {"reference": self.reference, "nodes": dict(self.nodes),
                "pushed": list(self.pushed), "pushed_bytes": self.pushed_bytes}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping | None) -> EnvironmentRecord | None:
        if not data:
            return None
        return cls(reference=data.get("reference"), nodes=dict(data.get("nodes") or {}),
                   pushed=tuple(data.get("pushed") or ()),
                   pushed_bytes=int(data.get("pushed_bytes") or 0))  # fmt: skip


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a job, as job.json keeps it under `attempts` (the first is 1; its
    ranks saw ORCH_RESTART_COUNT = number - 1). `cause`: its class and message naming the
    node and rank, and what orch decided (None when it succeeded); `excluded`: the nodes
    dropped after it; `logs`: where its head-side logs are, in the record."""

    number: int
    nodes: tuple[str, ...]
    started: str
    ended: str | None = None
    exit_code: int | None = None
    cause: Mapping[str, str] | None = None  # {"class", "message", "decision"}
    excluded: tuple[str, ...] = ()
    logs: str = LOGS_DIR
    stacks: str | None = None  # the stacks taken at its teardown, in the record
    # its nodes' environments (None: its pre-flight was skipped)
    environment: EnvironmentRecord | None = None
    allocation: int = 1  # the Slurm allocation it ran in, for a requeued batch job: 1 first

    def to_json(self) -> dict:
        data = asdict(self)
        data["environment"] = None if self.environment is None else self.environment.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping) -> AttemptRecord:
        lists = {name: tuple(data.get(name, ())) for name in ("nodes", "excluded")}
        cause = data.get("cause")
        environment = EnvironmentRecord.from_json(data.get("environment"))
        return cls(**{**data, **lists, "cause": dict(cause) if cause else None,
                      "environment": environment})  # fmt: skip


def _rank_from_json(data: Mapping) -> RankRecord:
    return RankRecord(**{**data, "role": Role(data["role"])})


def _failure_from_json(data: Mapping) -> FirstFailure:
    lists = {name: tuple(data.get(name, ())) for name in ("last_lines", "traceback")}
    kind = FailureKind(data.get("kind", FailureKind.RANK))
    return FirstFailure(**{**data, **lists, "kind": kind})


@dataclass(frozen=True)
class JobRecord:
    id: str
    state: JobState
    launcher: str
    command: tuple[str, ...]
    hosts: tuple[str, ...]
    workdir: str
    started_at: str
    head_pid: int
    head_start: str | None  # /proc start time of the head process, against pid reuse
    ended_at: str | None = None
    exit_code: int | None = None
    node_exit_codes: Mapping[str, int | None] = field(default_factory=dict)
    first_failure: FirstFailure | None = None
    recipe: str | None = None
    python: str = "python3"  # the interpreter on the nodes (runs the kill program too)
    node_logs: Mapping[str, str] = field(default_factory=dict)  # node -> "ok" or the problem
    teardown_stacks: str | None = None  # the running ranks' stacks before a failure's teardown
    main_port: int | None = None  # the job's rendezvous port on node 0
    main_port_chosen: bool = False  # picked by orch (free on node 0), not given
    fanout: Fanout = Fanout.PDSH  # what started the node side: pdsh, or a Slurm step (srun)
    slurm_job_id: str | None = None  # the allocation it ran in (or --sbatch submitted)
    slurm_step: str | None = None  # <job>.<step> of the srun fan-out
    slurm_batch: bool = False  # the Slurm job is this job's own (submitted with --sbatch)
    ranks: tuple[RankRecord, ...] = ()  # every rank's end, by rank
    transport: str = "ssh"  # how orch's own commands reach the nodes: ssh, or slurm (srun)
    attempt: int = 1  # the attempt running, or the last one
    attempt_started: str | None = None  # when it started (started_at: the job's first)
    attempts: tuple[AttemptRecord, ...] = ()  # every attempt that ended, first to last
    # the environments the nodes run (the latest attempt's); None: no pre-flight looked
    environment: EnvironmentRecord | None = None
    stop: StopSummary | None = None  # a stop's cause, time and every rank's part in it
    name: str | None = None  # what the user calls the job (None: a record that names none)
    script: str | None = None  # the training script as the plan runs it (None: not recorded)
    # the hang threshold in force at the end and where it came from (None: hangs not looked for)
    hang_watch: Mapping[str, object] | None = None
    # --checkpoint-dir (absolute) and how orch copies it (None: the job was given none)
    checkpoints: CheckpointSettings | None = None
    allocation: int = 1  # a batch job's Slurm allocation running it, or the last: 1 first
    # --requeue: whether the job went on in another allocation after this one, and why
    requeue: RequeueDecision | None = None
    # the ORCH_NODE_ROOT it ran with ("": orch's own place; None: a record that does not say)
    node_root: str | None = None

    def node_root_or(self, here: str) -> str:
        """Where the job's node directories are: under the ORCH_NODE_ROOT it ran with, or,
        for a record that does not say, under `here` (this shell's setting)."""
        return here if self.node_root is None else self.node_root

    @property
    def exit_code_from(self) -> str | None:
        """Whose exit code the job's is: "job" (a rank's own, or 0), "launcher" (the head
        launcher's), "orch" (orch's verdict: a hang, a node lost, a stop, an interrupt)."""
        if self.exit_code is None:
            return None
        failure = self.first_failure
        if failure is None or failure.kind == FailureKind.RANK:
            return "job"
        return "launcher" if failure.kind == FailureKind.HEAD else "orch"

    def to_json(self) -> dict:
        data = {"schema": JOB_SCHEMA, "schema_version": SCHEMA_VERSION, **asdict(self)}
        data["exit_code_from"] = self.exit_code_from
        data["stop"] = None if self.stop is None else self.stop.to_json()
        data["command"] = list(self.command)
        data["hosts"] = list(self.hosts)
        data["node_exit_codes"] = dict(self.node_exit_codes)
        data["node_logs"] = dict(self.node_logs)
        data["ranks"] = [asdict(rank) for rank in self.ranks]
        data["attempts"] = [attempt.to_json() for attempt in self.attempts]
        data["environment"] = None if self.environment is None else self.environment.to_json()
        data["checkpoints"] = None if self.checkpoints is None else self.checkpoints.to_dict()
        data["requeue"] = None if self.requeue is None else self.requeue.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping) -> JobRecord:
        failure = data.get("first_failure")
        return cls(
            id=str(data["id"]),
            state=JobState(data["state"]),
            launcher=str(data.get("launcher", "")),
            command=tuple(data.get("command", ())),
            hosts=tuple(data.get("hosts", ())),
            workdir=str(data.get("workdir", "")),
            started_at=str(data.get("started_at", "")),
            head_pid=int(data.get("head_pid", 0)),
            head_start=data.get("head_start"),
            ended_at=data.get("ended_at"),
            exit_code=data.get("exit_code"),
            node_exit_codes=dict(data.get("node_exit_codes", {})),
            first_failure=_failure_from_json(failure) if failure else None,
            recipe=data.get("recipe"),
            python=str(data.get("python") or "python3"),
            node_logs=dict(data.get("node_logs", {})),
            teardown_stacks=data.get("teardown_stacks"),
            main_port=data.get("main_port"),
            main_port_chosen=bool(data.get("main_port_chosen", False)),
            fanout=Fanout(data.get("fanout") or Fanout.PDSH),
            slurm_job_id=data.get("slurm_job_id"),
            slurm_step=data.get("slurm_step"),
            slurm_batch=bool(data.get("slurm_batch", False)),
            ranks=tuple(_rank_from_json(rank) for rank in data.get("ranks", ())),
            transport=str(data.get("transport") or "ssh"),
            attempt=int(data.get("attempt", 1)),
            attempt_started=data.get("attempt_started"),
            attempts=tuple(AttemptRecord.from_json(a) for a in data.get("attempts", ())),
            environment=EnvironmentRecord.from_json(data.get("environment")),
            stop=StopSummary.from_json(data.get("stop")),
            name=data.get("name"),
            script=data.get("script"),
            hang_watch=data.get("hang_watch"),
            checkpoints=_checkpoints_from_json(data.get("checkpoints")),
            allocation=int(data.get("allocation", 1)),
            requeue=RequeueDecision.from_json(data.get("requeue")),
            node_root=data.get("node_root"),
        )


def _checkpoints_from_json(data: Mapping | None) -> CheckpointSettings | None:
    return None if data is None else CheckpointSettings.from_dict(data)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_job_id() -> str:
    """Sortable by time, unique across heads: 20261121-232700-9f3a1c."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def runs_root(option: str | os.PathLike | None = None) -> Path:
    """--runs-dir, else $ORCH_RUNS_DIR, else ./runs: absolute, the directories above it
    resolved but not itself (a link there is refused, never followed: records/rundir.py)."""
    chosen = Path(option or os.environ.get(RUNS_DIR_VAR) or "runs").expanduser()
    if chosen.name in ("", ".", ".."):
        return chosen.resolve()
    return chosen.absolute().parent.resolve() / chosen.name


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of a process (clock ticks since boot), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return fields[19]


def head_alive(record: JobRecord) -> bool:
    return (
        record.head_start is not None and process_start_time(record.head_pid) == record.head_start
    )


def batch_state(record: JobRecord, slurm_state: str | None) -> str:
    """A batch job's state; `slurm-<state>` (Slurm's own word) when it ended before orch
    started in it."""
    if slurm_state in SLURM_ACTIVE_STATES:
        if slurm_state == "PENDING":
            return JobState.QUEUED
        # Slurm runs it, and orch inside has not written its own record yet.
        return JobState.STARTING if record.state == JobState.QUEUED else record.state
    if record.state == JobState.QUEUED:  # ended before orch started in it
        return f"slurm-{(slurm_state or 'gone').lower()}"
    return JobState.HEAD_DIED


def finished(record: JobRecord, **changes: object) -> JobRecord:
    return replace(record, ended_at=now_iso(), **changes)  # type: ignore[arg-type]


def first_failure_of(why: Explanation) -> FirstFailure:
    """The record's first failure, from its explanation."""
    failure, root = why.failure, why.root_cause
    return FirstFailure(
        node=failure.node or "head",
        rank=failure.rank,
        exit_code=failure.exit_code,
        reason=failure.reason,
        last_lines=why.last_lines,
        kind=failure.kind,
        root_cause_rank=root.rank if root else None,
        root_cause_node=why.root_cause_node,
        root_cause=root.exception if root else None,
        traceback=root.lines if root else (),
        then=why.order.summary(),
        hint=why.hint,
    )
