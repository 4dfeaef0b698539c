"""A Slurm allocation as an inventory: nodes and ranks per node from the variables Slurm
sets inside `salloc`/`sbatch`, in place of a hostfile. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from orchestrator.errors import UsageError
from orchestrator.specs.inventory import Hostfile, expand_nodeset, make_hostfile
from orchestrator.specs.words import Fanout, fanout_named

JOB_ID_VAR = "SLURM_JOB_ID"
NODELIST_VAR = "SLURM_JOB_NODELIST"
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
NO_ALLOCATION_HINT = (
    "run orch inside one (`salloc -N 2 --ntasks-per-node=8 orch launch --slurm ...`), "
    "or let Slurm make one for a recipe: `orch submit RECIPE --sbatch`"
)

# squeue's words for a job that is not over yet.
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED")


@dataclass(frozen=True)
class Allocation:
    """What Slurm granted: the job id, its nodes in Slurm's order, and per node the tasks
    (SLURM_TASKS_PER_NODE), the CPUs (SLURM_JOB_CPUS_PER_NODE) and the GPUs
    (SLURM_GPUS_ON_NODE, the same on every node) it holds."""

    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...] = ()
    gpus_on_node: int | None = None
    cpus_per_node: tuple[int, ...] = ()

    @property
    def slots(self) -> tuple[int, ...]:
        """Ranks per node: the GPUs when Slurm gave any, else the tasks, else one."""
        if self.gpus_on_node:
            return (self.gpus_on_node,) * len(self.nodes)
        if len(self.tasks_per_node) == len(self.nodes):
            return self.tasks_per_node
        return (1,) * len(self.nodes)

    def slots_for(self, nproc_per_node: int | None) -> tuple[int, ...]:
        """Ranks per node for a job that asks for `nproc_per_node`. Without GPUs an explicit
        count is honoured where every node holds that many CPUs: the torchrun recipe
        allocates one task per node (`--ntasks-per-node=1 --cpus-per-task=N`) and lets
        torchrun start the ranks, so the task count says nothing about them."""
        cpus = self.cpus_per_node
        if nproc_per_node is None or self.gpus_on_node or len(cpus) != len(self.nodes):
            return self.slots
        return (nproc_per_node,) * len(self.nodes)


def expand_counts(text: str) -> tuple[int, ...]:
    """Slurm's compressed per-node counts: `2(x3),1` -> (2, 2, 2, 1)."""
    counts: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _COUNT.match(part)
        if match is None:
            raise UsageError(f"cannot read Slurm's per-node count {part!r} in {text!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return tuple(counts)


def allocation_from_env(environ: Mapping[str, str]) -> Allocation | None:
    """The allocation this process runs in, or None outside of one."""
    job_id = environ.get(JOB_ID_VAR) or environ.get("SLURM_JOBID")
    if not job_id:
        return None
    nodelist = environ.get(NODELIST_VAR) or environ.get("SLURM_NODELIST") or ""
    if not nodelist:
        raise UsageError(
            f"Slurm job {job_id}: {NODELIST_VAR} is not set, so its nodes are unknown",
            "run orch from the allocation's own shell (salloc) or batch script",
        )
    gpus = environ.get("SLURM_GPUS_ON_NODE", "")
    nodes = tuple(expand_nodeset(nodelist))
    return Allocation(
        job_id=job_id,
        nodes=nodes,
        tasks_per_node=expand_counts(environ.get("SLURM_TASKS_PER_NODE", "")),
        gpus_on_node=int(gpus) if gpus.isdigit() and int(gpus) > 0 else None,
        cpus_per_node=_cpus_per_node(environ, len(nodes)),
    )


def _cpus_per_node(environ: Mapping[str, str], nodes: int) -> tuple[int, ...]:
    """The CPUs the allocation holds on each node: SLURM_JOB_CPUS_PER_NODE (`2(x3)`), else
    SLURM_CPUS_ON_NODE (set in a batch script and a step, for the node it runs on) for
    every node; () when Slurm said neither."""
    per_node = expand_counts(environ.get("SLURM_JOB_CPUS_PER_NODE", ""))
    if len(per_node) == nodes:
        return per_node
    on_node = environ.get("SLURM_CPUS_ON_NODE", "")
    return (int(on_node),) * nodes if on_node.isdigit() else ()


def require_allocation(environ: Mapping[str, str]) -> Allocation:
    allocation = allocation_from_env(environ)
    if allocation is None:
        raise UsageError(f"no Slurm allocation: {JOB_ID_VAR} is not set", NO_ALLOCATION_HINT)
    return allocation


def allocation_hostfile(
    allocation: Allocation, *, nodes: int | None = None, nproc_per_node: int | None = None
) -> Hostfile:
    """The allocation as a hostfile. `nodes` and `nproc_per_node` are what the job asks
    for: more than the allocation holds is refused in Slurm's terms, never run short."""
    have = len(allocation.nodes)
    if nodes is not None and nodes > have:
        raise UsageError(
            f"Slurm job {allocation.job_id} holds {have} node(s) "
            f"({', '.join(allocation.nodes)}), fewer than the {nodes} asked for",
            f"allocate {nodes}: `salloc -N {nodes} ...`, or ask for {have}",
        )
    gpus = allocation.gpus_on_node
    if nproc_per_node is not None and gpus is not None and nproc_per_node > gpus:
        raise UsageError(
            f"Slurm job {allocation.job_id} holds {gpus} GPU(s) per node, fewer than the "
            f"{nproc_per_node} ranks per node asked for",
            f"allocate them: `salloc --gpus-per-node={nproc_per_node} ...`",
        )
    names = allocation.nodes[: nodes or have]
    if nproc_per_node is not None and gpus is None:
        _check_cpus(allocation, names, nproc_per_node)
    slots = allocation.slots_for(nproc_per_node)
    return make_hostfile(names, list(slots[: len(names)]), source=f"Slurm job {allocation.job_id}")


def _check_cpus(allocation: Allocation, names: tuple[str, ...], nproc_per_node: int) -> None:
    """Without GPUs, ranks per node beyond the CPUs Slurm gave a node are refused, naming it."""
    cpus = dict(zip(allocation.nodes, allocation.cpus_per_node, strict=False))
    short = [name for name in names if name in cpus and cpus[name] < nproc_per_node]
    if short:
        raise UsageError(
            f"Slurm job {allocation.job_id} holds {cpus[short[0]]} CPU(s) on {short[0]!r}, "
            f"fewer than the {nproc_per_node} ranks per node asked for",
            f"allocate them: `salloc -N {len(names)} --ntasks-per-node=1 "
            f"--cpus-per-task={nproc_per_node} ...`, or ask for fewer ranks per node",
        )


def job_inventory(
    hostfile: Hostfile | None,
    *,
    slurm: bool,
    environ: Mapping[str, str],
    nproc_per_node: int | None = None,
    nodes: int | None = None,
) -> tuple[Hostfile, Allocation | None]:
    """The hosts a job may run on: `--hostfile`, unless `--slurm` asks for the allocation;
    with neither, the allocation this runs in, if any (whole: its nodes past the first
    `nodes` are the job's spares; more than it holds is refused in Slurm's words)."""
    if hostfile is not None and not slurm:
        return hostfile, None
    allocation = allocation_from_env(environ)
    if allocation is None:
        if slurm:
            raise UsageError(f"no Slurm allocation: {JOB_ID_VAR} is not set", NO_ALLOCATION_HINT)
        raise UsageError(
            "no hostfile given", "pass --hostfile F (e.g. the one `orch sandbox up` prints)"
        )
    allocation_hostfile(allocation, nodes=nodes, nproc_per_node=nproc_per_node)  # checks
    return allocation_hostfile(allocation, nproc_per_node=nproc_per_node), allocation


def chosen_fanout(fanout: str | None, launcher: str, in_allocation: bool) -> Fanout:
    """--fanout as given; else srun inside an allocation (for the launchers whose nodes orch
    starts itself), pdsh otherwise."""
    if fanout:
        return fanout_named(fanout)
    return Fanout.SRUN if in_allocation and launcher != "pdsh" else Fanout.PDSH


# Before its allocation ends, a job stops this long before the end plus the ranks' grace:
# the teardown and the logs' return, and Slurm's own signal may come up to a minute early.
SLURM_STOP_MARGIN_S = 60.0
_LEFT = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


def slurm_time_left(text: str) -> float | None:
    """Seconds from squeue's %L (`1-02:03:04`, `02:03:04`, `03:04`); None for UNLIMITED,
    NOT_SET, INVALID or anything else it may print."""
    found = _LEFT.match(text.strip())
    if found is None:
        return None
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def slurm_end_left(text: str, now: float) -> float | None:
    """Seconds from `now` (the wall clock) to squeue's %e (`2026-12-02T18:46:21`, local
    time): the job's end as the controller holds it, which a preemption's grace brings
    forward (%L counts from the time limit alone); None for `N/A`, `Unknown` or the like."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp() - now
    except ValueError:
        return None


def stop_before_the_end(left: float | None, grace: float) -> float | None:
    """Seconds from now at which a job in an allocation with `left` seconds to run stops,
    so that its ranks' grace and the teardown end before Slurm's limit; None: no limit."""
    if left is None:
        return None
    return max(0.0, left - grace - SLURM_STOP_MARGIN_S)


# Once Slurm TERMs the batch shell (a requeue, `scancel`, a preemption's grace over), it
# SIGKILLs what is left KillWait seconds later; the head keeps this much of it for the
# teardown, the record and the summary, and gives the ranks the rest.
SLURM_KILL_WAIT_KEPT_S = 15.0
_KILL_WAIT = re.compile(r"^KillWait\s*=\s*(\d+)\s*sec", re.MULTILINE)


def parse_kill_wait(config: str) -> float | None:
    """KillWait from `scontrol show config`'s lines (`KillWait = 30 sec`); None if absent."""
    found = _KILL_WAIT.search(config)
    return float(found.group(1)) if found else None


def slurm_kills_at(term_at: float, kill_wait: float | None) -> float | None:
    """When a stop's ranks must be done, Slurm's SIGTERM having reached the head at
    `term_at`; None: Slurm does not say its KillWait."""
    if kill_wait is None:
        return None
    return term_at + max(0.0, kill_wait - SLURM_KILL_WAIT_KEPT_S)


# --sbatch --requeue: how many times a job may be requeued (allocations after the first) when
# neither --max-requeues nor the recipe's slurm: {max_requeues: N} says. Enough for a week of
# training under a one-day limit; a bound, so that a job stopped again and again ends.
DEFAULT_MAX_REQUEUES = 10
RESTART_COUNT_VAR = "SLURM_RESTART_COUNT"  # set by Slurm in a batch job it has requeued


@dataclass(frozen=True)
class RequeueSettings:
    """`--requeue` (recipe `slurm: {requeue: true}`) and the most requeues it may make."""

    requeue: bool = False
    max_requeues: int = DEFAULT_MAX_REQUEUES


@dataclass(frozen=True)
class SlurmJobView:
    """What Slurm says of a job now: its state (RUNNING, COMPLETING, PENDING...) and how many
    times it was requeued (`Restarts`)."""

    state: str
    restarts: int


def parse_job_view(text: str) -> SlurmJobView | None:
    """`scontrol show job -o ID`'s one line as a view; None when it names no state."""
    fields = dict(word.partition("=")[::2] for word in text.split() if "=" in word)
    state = fields.get("JobState", "")
    if not state:
        return None
    restarts = fields.get("Restarts", "0")
    return SlurmJobView(state, int(restarts) if restarts.isdigit() else 0)


def restart_count(environ: Mapping[str, str]) -> int:
    """How many times Slurm had requeued the batch job when this allocation started it."""
    value = environ.get(RESTART_COUNT_VAR, "")
    return int(value) if value.isdigit() else 0
