"""The job's verdict, as a pure state machine: events in, decisions out.

The launch loop (run/launch.py) turns what it reads and sees into events (outcome/events.py)
— a node was heard from, a node's agent reported its exit, pdsh said a node's ssh ended,
the fan-out's output ended, the head process exited, an interrupt, the teardown finished,
the clock — and acts on the decisions: tear the job down because of a failure, stop reading. Every
event carries its time (the loop's monotonic clock), so the verdict never reads a clock
and every timeout is a named setting. Pure: no I/O, no clock, no threads.

The rules:
- every node exits 0: success (unless the head launcher then fails);
- a node reports a non-zero exit: the earliest failure (by the agent's `failed_at`) among
  those reported within `settle` seconds of the first is the job's;
- a node goes silent (no sign of life for `heartbeat_timeout` seconds once it started), or
  never starts (`start_timeout` after another node did), or its ssh connection ends
  before it reported: that node failed;
- the head launcher's output ends before every node reported: the first node missing
  (once any node was heard), else the head launcher itself, failed;
- no rank wrote anything (a line or a progress frame) beyond the hang threshold while
  every node still answers, and a look finds no rank working: the job hung (exit code
  HANG_EXIT_CODE; outcome/hang_watch.py);
- a stop (the first SIGINT on the head, `orch stop`, `time_limit` seconds after the first
  event): every rank is sent the stop signal (`begin_stop`) and the job waits: nothing a
  node does then is a failure, until every node exited (the stop's outcome: interrupted
  after Ctrl-C, else stopped, with the cause's exit code) or `rank_grace` seconds passed
  (then it is torn down);
- SIGTERM on the head, or SIGINT during a stop: interrupted; `orch kill`: killed (128 +
  the signal), at once.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.outcome.allocation import AllocationEnd
from orchestrator.outcome.events import (
    AllocationLeft,
    Event,
    HeadExited,
    Interrupted,
    NodeExited,
    NodeHeard,
    OutputEnded,
    QuietLooked,
    RankOutput,
    SshEnded,
    StopAsked,
    TeardownDone,
    Tick,
    WatchSettings,
)
from orchestrator.outcome.hang_watch import HangWatch
from orchestrator.outcome.pace import HangPace
from orchestrator.outcome.rank_ends import ended_by
from orchestrator.outcome.states import (
    REMOTE_COMMAND_FAILED,
    SSH_LOST,
    Failure,
    FailureKind,
    JobState,
    StopCause,
)
from orchestrator.outcome.stop import GraceInForce, grace_in_force
from orchestrator.specs.slurm import slurm_kills_at

# The longest a node's late heartbeats put off its silence: an agent whose writes to the head
# stay blocked this long tears its job down by itself (remote/channel.py STALL_S).
MAX_BEHIND_S = 30.0


# ----- decisions and the outcome -----------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    tear_down: Failure | None = None  # begin tearing the job down, because of this
    stop_reading: bool = False  # end the fan-out now
    begin_stop: StopCause | None = None  # send every rank the stop signal, because of this
    look: bool = False  # the job is quiet beyond its hang timeout: look at every rank


KEEP_GOING = Decision()


@dataclass(frozen=True)
class Outcome:
    state: JobState  # succeeded, failed, interrupted or killed
    exit_code: int
    failure: Failure | None
    node_exit_codes: dict[str, int | None] = field(default_factory=dict)


# ----- the state machine ------------------------------------------------------------------
class JobVerdict:
    """Feed it every event in order; act on each decision. `outcome()` at the end."""

    def __init__(
        self, hosts: Sequence[str], settings: WatchSettings, *, head_launcher: bool
    ) -> None:
        self.hosts = tuple(hosts)
        self.settings = settings
        self.head_launcher = head_launcher  # the pdsh launcher: the head runs accelerate
        self.exits: dict[str, Mapping[str, object]] = {}
        self.last_seen: dict[str, float] = {}
        self.behind: dict[str, float] = {}  # NodeHeard.behind, at most MAX_BEHIND_S
        self.first_heard_at: float | None = None  # when the first node showed life
        self.last_output_at: float | None = None  # when a rank last wrote something
        self.ssh_exits: dict[str, int] = {}
        self.candidates: list[Failure] = []
        self.first_candidate_at: float | None = None
        self.interrupt: Interrupted | None = None
        self.output_ended = False
        self.head_code: int | None = None
        self.failure: Failure | None = None
        self.teardown_done_at: float | None = None
        self.teardown_unanswered: frozenset[str] = frozenset()
        self.all_exited_at: float | None = None
        # How far the head has read what arrived; silence is judged up to there only.
        self.read_up_to: float | None = None
        self.started_at: float | None = None  # the first event's: the time limit counts from it
        self.stop: StopAsked | None = None  # the stop asked for, whatever came of it
        self.slurm_kills_at: float | None = None  # Slurm TERMed the head: its SIGKILL nears
        self.allocation = AllocationEnd()  # the allocation's end, as Slurm last said it
        self._stop_begun = False
        self.hangs = HangWatch(settings)

    # -- events ---------------------------------------------------------------------
    def feed(self, event: Event) -> Decision:
        if self.started_at is None:
            self.started_at = event.at
        self._record(event)
        return self._decide(event.at)

    @property
    def stopping(self) -> bool:
        """A stop is under way: the ranks have their grace, nothing has been torn down."""
        return self.stop is not None and self.failure is None

    def _record(self, event: Event) -> None:
        if isinstance(event, NodeHeard):
            if event.node in self.hosts:
                self.last_seen[event.node] = event.at
                self.behind[event.node] = min(event.behind, MAX_BEHIND_S)
                if self.first_heard_at is None:
                    self.first_heard_at = event.at
        elif isinstance(event, RankOutput):
            self.last_output_at = event.at
            self.hangs.output(event.at, stepping=event.stepping)
        elif isinstance(event, NodeExited):
            self._record_exit(event)
        elif isinstance(event, SshEnded):
            if event.node in self.hosts:
                self.ssh_exits.setdefault(event.node, event.code)
        elif isinstance(event, OutputEnded):
            self.output_ended = True
        elif isinstance(event, HeadExited):
            self.head_code = event.code
        elif isinstance(event, Interrupted):
            self._record_signal(event)
        elif isinstance(event, StopAsked):
            if self._may_stop():
                self.stop = event
        elif isinstance(event, QuietLooked):
            self.hangs.looked(event, self.last_output_at, self._quiet_since())
        elif isinstance(event, AllocationLeft):
            self.allocation.answered(event.left, event.at)
        elif isinstance(event, TeardownDone):
            self.teardown_done_at = event.at
            self.teardown_unanswered = event.unanswered
        elif isinstance(event, Tick):
            self.read_up_to = event.read_up_to

    def _record_signal(self, event: Interrupted) -> None:
        """The first Ctrl-C asks the ranks to save; so does Slurm's warning (SIGUSR1, which
        orch's batch script asks for) and, inside an allocation, Slurm's SIGTERM (a
        preemption, the limit), which during a stop changes nothing. Anything else (a
        second Ctrl-C, `orch kill`, a TERM elsewhere) ends the job at once."""
        slurm_term = event.signum == signal.SIGTERM and self.settings.in_slurm
        from_slurm = event.signum == signal.SIGUSR1 or slurm_term
        if slurm_term and not event.killed and self.slurm_kills_at is None:
            self.slurm_kills_at = slurm_kills_at(event.at, self.settings.slurm_kill_wait)
        if not event.killed and event.signum == signal.SIGINT and self._may_stop():
            self.stop = StopAsked(StopCause.CTRL_C, event.at)
        elif not event.killed and from_slurm and self._may_stop():
            self.stop = StopAsked(StopCause.SLURM_SIGNAL, event.at)
        elif not event.killed and from_slurm and self.stopping:
            return
        else:
            self.interrupt = self.interrupt or event

    def _record_exit(self, event: NodeExited) -> None:
        node, fields = event.node, event.fields
        if node not in self.hosts or node in self.exits:
            return
        self.exits[node] = fields
        self.last_seen[node] = event.at
        code = _as_int(fields.get("code"), 1)
        if code == 0 or self.failure is not None:
            return
        rank_code = fields.get("rank_code")
        exit_code = rank_code if isinstance(rank_code, int) and rank_code != 0 else code
        rank = fields.get("rank")
        if self.first_candidate_at is None:
            self.first_candidate_at = event.at
        self.candidates.append(
            Failure(
                node=node,
                reason=str(fields.get("error") or ended_by(exit_code)),
                exit_code=128 - exit_code if exit_code < 0 else exit_code,
                rank=rank if isinstance(rank, int) else None,
                when=_as_float(fields.get("failed_at")) or event.wall_time,
            )
        )

    # -- decisions ------------------------------------------------------------------
    def _may_stop(self) -> bool:
        return self.stop is None and self.failure is None and self.interrupt is None

    def _decide(self, now: float) -> Decision:
        started = self.started_at
        for limit, cause in ((self.settings.time_limit, StopCause.TIME_LIMIT),
                             (self.settings.slurm_stop_after, StopCause.SLURM_LIMIT)):  # fmt: skip
            up = limit is not None and started is not None and now - started >= limit
            if up and self._may_stop():
                self.stop = StopAsked(cause, now)
        if self.allocation.stop_due(now, self.settings.rank_grace) and self._may_stop():
            self.stop = StopAsked(StopCause.SLURM_SIGNAL, now)  # a preemption, most likely
        begin = None
        if self.stop is not None and not self._stop_begun and self.failure is None:
            self._stop_begun = True
            begin = self.stop.cause
        tear_down = None
        if self.failure is None:
            self.failure = self._find_failure(now)
            tear_down = self.failure
        look, self.hangs.look_wanted = self.hangs.look_wanted, False
        return Decision(tear_down=tear_down, stop_reading=self._should_stop(now),
                        begin_stop=begin, look=look)  # fmt: skip

    def _should_stop(self, now: float) -> bool:
        if self.output_ended and self.head_code is not None:
            return True
        if self.teardown_done_at is not None:
            if self._every_answering_node_exited():
                return True  # nothing more to read: the rest would be waiting for a dead node
            return now - self.teardown_done_at > self.settings.drain_after_teardown
        if self.failure is None and self.all_exited():
            self.all_exited_at = self.all_exited_at if self.all_exited_at is not None else now
            return now - self.all_exited_at > self.settings.head_wind_down
        return False

    def _find_failure(self, now: float) -> Failure | None:
        if self.interrupt is not None:
            return _interrupted(self.interrupt)
        if self.stop is not None:  # the ranks are saving: only the grace's end tears down
            return self._grace_over(now, self.stop)
        if self.candidates and self.first_candidate_at is not None:
            if now - self.first_candidate_at >= self.settings.settle or self.output_ended:
                return min(self.candidates, key=lambda c: c.when)
            return None  # an earlier failure may still be on its way
        # The head's own backlog is not the nodes' silence: what it has not read yet may
        # hold their heartbeats and output, so silence and hangs count up to what it read.
        read = now if self.read_up_to is None else min(now, self.read_up_to)
        return (
            self._silent_node(read) or self._lost_node() or self._ended_early() or self._hung(read)
        )

    @property
    def grace(self) -> GraceInForce:
        """The stop's grace: the one asked for, less once Slurm is ending the job."""
        at = self.stop.at if self.stop is not None else None
        grace = grace_in_force(self.settings.rank_grace, at, self.slurm_kills_at,
                               self.settings.slurm_kill_wait)  # fmt: skip
        moved = self.allocation.grace(grace.seconds, at) if at is not None else None
        return grace if moved is None else moved

    def _grace_over(self, now: float, stop: StopAsked) -> Failure | None:
        grace = self.grace
        if now - stop.at < grace.seconds or self.all_exited():
            return None
        return Failure("", grace.ran_out(stop.cause), stop.cause.exit_code,
                       kind=FailureKind.STOPPED)  # fmt: skip

    def _silent_node(self, now: float) -> Failure | None:
        timeout = self.settings.heartbeat_timeout
        for node in self.hosts:
            last = self.last_seen.get(node)
            # A node whose heartbeats came late has output on its way that arrives as late:
            # its silence counts from then.
            late = self.behind.get(node, 0.0)
            if node not in self.exits and last is not None and now - last > timeout + late:
                reason = f"stopped answering (no heartbeat for {now - last:.0f} s)"
                return Failure(node, reason, 1, kind=FailureKind.SILENT)
        first = self.first_heard_at
        if first is not None and now - first > self.settings.start_timeout:
            for node in self.hosts:
                if node not in self.last_seen:
                    return Failure(node, "never started", 1, kind=FailureKind.SILENT)
        return None

    def _lost_node(self) -> Failure | None:
        for node, code in self.ssh_exits.items():
            if node in self.exits:
                continue
            if code == SSH_LOST:
                reason = "lost its ssh connection (ssh exit 255)"
                return Failure(node, reason, 1, kind=FailureKind.LOST)
            # The agent never ran (e.g. no such interpreter): the remote shell's code.
            return Failure(node, f"{REMOTE_COMMAND_FAILED} {code}", code,
                           kind=FailureKind.LOST)  # fmt: skip
        return None

    def _ended_early(self) -> Failure | None:
        if not (self.output_ended and self.head_code is not None) or self.all_exited():
            return None
        missing = [h for h in self.hosts if h not in self.exits]
        if self.last_seen or not self.head_launcher:
            fanout = ended_by(self.head_code)
            reason = f"ended without reporting an exit code (the fan-out: {fanout})"
            return Failure(missing[0], reason, 1, kind=FailureKind.LOST)
        return _head_failed(self.head_code)

    @property
    def pace(self) -> HangPace:
        return self.hangs.pace

    def hang_watch(self) -> dict[str, object] | None:
        """For the record: the hang threshold in force at the end (outcome/hang_watch.py)."""
        return self.hangs.record()

    def _quiet_since(self) -> float | None:
        """When a rank last wrote something; before any did, when the job was first heard."""
        return self.first_heard_at if self.last_output_at is None else self.last_output_at

    def _hung(self, now: float) -> Failure | None:
        return self.hangs.hung(now, self._quiet_since(), finished=self.all_exited())

    def _every_answering_node_exited(self) -> bool:
        failure = self.failure
        stopped = failure is not None and failure.kind == FailureKind.SILENT
        silent = failure.node if failure is not None and stopped else None
        gone = {silent, *self.teardown_unanswered}
        return all(h in self.exits or h in gone for h in self.hosts)

    def all_exited(self) -> bool:
        return all(h in self.exits for h in self.hosts)

    # -- the end --------------------------------------------------------------------
    def outcome(self, head_code: int | None, *, stopped_by_us: bool) -> Outcome:
        """The job's state and exit code once the fan-out is over. `stopped_by_us`: orch
        ended the head process itself (after every node exited, or at teardown)."""
        if stopped_by_us and self.failure is None and self.all_exited():
            head_code = 0  # stopped by us after every node succeeded
        node_codes = {
            h: (_as_int(self.exits[h].get("code"), 1) if h in self.exits else None)
            for h in self.hosts
        }
        failure = self.failure
        stop = self.stop
        if stop is not None and (failure is None or failure.kind == FailureKind.STOPPED):
            # Whatever the ranks did with their grace, the job ended because it was asked to.
            failure = failure or Failure("", f"stopped by {stop.cause.said}",
                                         stop.cause.exit_code, kind=FailureKind.STOPPED)
            state = JobState.INTERRUPTED if stop.cause == StopCause.CTRL_C else JobState.STOPPED
            return Outcome(state, failure.exit_code, failure, node_codes)
        if failure is None and self.head_launcher and head_code not in (0, None):
            # Every node said 0 but the head launcher failed: still a failure.
            failure = _head_failed(head_code)
        if failure is None:
            return Outcome(JobState.SUCCEEDED, 0, None, node_codes)
        state = _ENDED_BY.get(failure.kind, JobState.FAILED)
        return Outcome(state, failure.exit_code, failure, node_codes)


_ENDED_BY = {FailureKind.SIGNAL: JobState.INTERRUPTED, FailureKind.KILLED: JobState.KILLED}


def _interrupted(event: Interrupted) -> Failure:
    name = signal.Signals(event.signum).name
    reason = "killed by `orch kill`" if event.killed else f"interrupted by {name}"
    kind = FailureKind.KILLED if event.killed else FailureKind.SIGNAL
    return Failure(node="", reason=reason, exit_code=128 + event.signum, kind=kind)


def _head_failed(code: int | None) -> Failure:
    reason = f"the head launcher exited with code {code}"
    return Failure("", reason, code or 1, kind=FailureKind.HEAD)


def _as_int(value: object, default: int) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return default


def _as_float(value: object) -> float | None:
    try:
        return float(value) if value is not None else None  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
