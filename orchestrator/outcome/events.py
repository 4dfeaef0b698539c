"""What the launch loop tells the job's verdict (outcome/verdict.py), and the timeouts the
verdict judges it by.

One frozen value per thing the loop reads or sees (a node heard from, a node's exit, an
ended ssh, the output's end, the head's exit, an interrupt, a stop asked for, the
teardown's end, the clock), each with its time on the loop's monotonic clock; every timeout
is a named `WatchSettings` field. Pure values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.outcome.pace import PaceSeed
from orchestrator.outcome.quiet import QuietFinding
from orchestrator.outcome.states import StopCause
from orchestrator.specs.hang import FLOOR_S, START_FLOOR_S
from orchestrator.specs.stop import DEFAULT_STOP_GRACE_S


@dataclass(frozen=True)
class WatchSettings:
    """Every timeout of a launch, in seconds."""

    # A started node silent this long has stopped answering. Its agent sends a heartbeat
    # every 2 s from its own small process, whatever the ranks do: 10 s is five missed
    # beats, which only a frozen node, a dead link or a stopped ssh gives.
    heartbeat_timeout: float = 10.0
    start_timeout: float = 120.0  # a node never heard from, once another node started
    settle: float = 1.0  # after the first failure, wait this long for an earlier one
    # Read what the nodes the teardown reached say as they stop (each agent's last word holds
    # the ends of the ranks the teardown killed), then end; on a loaded node the agent needs
    # some seconds after its processes are gone.
    drain_after_teardown: float = 15.0
    head_wind_down: float = 60.0  # every node exited: the head launcher's time to end
    teardown_timeout: float = 20.0  # the whole teardown, every node at once
    stop_grace: float = 3.0  # TERM -> KILL for the head's own fan-out process
    hang_timeout: float | None = None  # no rank's output this long: look for a hang
    hang_learned: bool = False  # no hang_timeout: learn it from the job's pace (outcome/pace.py)
    hang_floors: tuple[float, float] = (FLOOR_S, START_FLOOR_S)  # learned: never less (before
    # the first step: the second)
    pace_seed: PaceSeed = field(default_factory=PaceSeed)  # what an earlier attempt learned
    stacks_timeout: float = 3.0  # taking the stacks before a teardown (per node, doubled
    # at most by the connect): it never delays the teardown by more than that
    hang_stacks_timeout: float = 15.0  # the same after a hang: the stacks are the answer
    # Quiet beyond hang_timeout: look at every rank for this long before calling it a hang
    # (outcome/quiet.py; 0: no look, silence alone decides), the look bounded by the second.
    look_seconds: float = 3.0
    look_timeout: float = 60.0
    look_again_after: float = 30.0  # a look that could not read every node: the next one
    # A stop (first Ctrl-C, `orch stop`, the time limit): how long the ranks have to exit by
    # themselves before the job is torn down; the time limit counts from the first event.
    rank_grace: float = DEFAULT_STOP_GRACE_S
    time_limit: float | None = None  # None: no limit
    # Inside a Slurm allocation (its job id; None: not in one): Slurm's SIGTERM is a stop too,
    # and the job stops this long after its start so that the grace ends before the
    # allocation does (None: no end). The allocation is asked this often what is left of it:
    # Slurm may bring its end forward (a preemption's grace) without a word to any process of
    # the job (outcome/allocation.py).
    slurm_job: str | None = None
    slurm_stop_after: float | None = None
    allocation_poll: float = 10.0
    # Slurm's KillWait: once its SIGTERM reaches the head, a stop's grace ends early enough
    # for the teardown to be done before Slurm's SIGKILL (None: not known, not cut).
    slurm_kill_wait: float | None = None

    @property
    def in_slurm(self) -> bool:
        return self.slurm_job is not None

    @property
    def teardown_budget(self) -> float:
        """The longest a teardown can take, stacks first (each bounded, connect included; a
        hang's stacks may take two looks a second apart)."""
        return self.teardown_timeout + 4 * max(self.stacks_timeout, self.hang_stacks_timeout) + 1


# ----- events --------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeHeard:
    """Any sign of life from a node: an output line, a progress frame, a heartbeat.
    `behind`: how late the node's last heartbeat arrived (its clock's offset aside)."""

    node: str
    at: float
    behind: float = 0.0


@dataclass(frozen=True)
class RankOutput:
    """A rank wrote something: an output line or a progress frame (not a heartbeat).
    `stepping`: a rank has shown a step by now (a progress bar's count, `step N`)."""

    at: float
    stepping: bool = False


@dataclass(frozen=True)
class NodeExited:
    """A node's agent reported its exit (`fields`: code, rank, rank_code, failed_at,
    error...). `wall_time` is when it arrived, by the wall clock the agent's failed_at
    uses."""

    node: str
    fields: Mapping[str, object]
    at: float
    wall_time: float


@dataclass(frozen=True)
class SshEnded:
    """pdsh reported that a node's ssh ended with this code."""

    node: str
    code: int
    at: float


@dataclass(frozen=True)
class OutputEnded:
    """The fan-out's output reached its end."""

    at: float


@dataclass(frozen=True)
class HeadExited:
    """The head's fan-out process (pdsh, or the head launcher) exited with this code."""

    code: int
    at: float


@dataclass(frozen=True)
class Interrupted:
    """A signal reached the head; `killed`: it came from `orch kill`."""

    signum: int
    killed: bool
    at: float


@dataclass(frozen=True)
class StopAsked:
    """The job was asked to stop and save, other than by a signal on the head: `orch stop`
    (its marker in the run directory)."""

    cause: StopCause
    at: float


@dataclass(frozen=True)
class QuietLooked:
    """What a look at the quiet job, asked for at `asked_at`, found."""

    finding: QuietFinding
    asked_at: float
    at: float


@dataclass(frozen=True)
class AllocationLeft:
    """Slurm's answer: the allocation has `left` seconds, as of `at`."""

    left: float
    at: float


@dataclass(frozen=True)
class TeardownDone:
    """The teardown's kill program returned; `unanswered`: the nodes it could not reach,
    whose agents are not waited for."""

    at: float
    unanswered: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Tick:
    """Time passed with nothing else to say. `read_up_to`: the head has read the fan-out's
    output as it arrived up to this moment (None: up to `at`, nothing is waiting); earlier
    when the head's own backlog holds output it has not read yet."""

    at: float
    read_up_to: float | None = None


Event = (
    NodeHeard
    | RankOutput
    | NodeExited
    | SshEnded
    | OutputEnded
    | HeadExited
    | Interrupted
    | StopAsked
    | QuietLooked
    | AllocationLeft
    | TeardownDone
    | Tick
)
