"""What a job's report shows, as frozen values: built from the run directory by read.py,
drawn by render.py. Times are seconds since the epoch on the head's clock, as job.json
keeps them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from orchestrator.outcome.rank_ends import Role
from orchestrator.outcome.stop import RankStop, StopSummary
from orchestrator.records.job import AttemptRecord, EnvironmentRecord, RankRecord
from orchestrator.records.moments import Moment
from orchestrator.report.checkpoints import CheckpointsView
from orchestrator.report.stop import StopLines, settings_words
from orchestrator.stacks.fold import rank_ranges
from orchestrator.stacks.profile import waited_for_words

# Ranks fold into one summary row per node above this many: a page of 1000 rank rows is
# read by nobody.
FOLD_RANKS_ABOVE = 64
OPEN_NODES_UP_TO = 8  # the timeline shows every node's ranks open up to this many nodes
TAIL_LINES = 20  # last lines shown per node


def how(rank: RankRecord) -> str:
    """How a rank ended, in words."""
    if rank.signal:
        return f"killed by {rank.signal}"
    if rank.exit_code is None:
        return "ended (exit code not seen)"
    return f"exited {rank.exit_code}"


@dataclass(frozen=True)
class NodeRow:
    node: str
    exit_code: int | None
    ranks: tuple[RankRecord, ...]
    last_lines: tuple[str, ...]
    log_href: str | None  # relative to the report: logs/<node>.log, None when absent
    is_cause: bool
    raw_logs: str | None = None  # why the node's raw logs were not collected
    raw_files: tuple[str, ...] = ()  # the raw logs pulled back from it, relative links

    @property
    def start(self) -> float | None:
        starts = [rank.start for rank in self.ranks if rank.start is not None]
        return min(starts) if starts else None

    @property
    def end(self) -> float | None:
        return max((rank.end for rank in self.ranks), default=None)


@dataclass(frozen=True)
class Cause:
    """The first failure: where, why, and what followed."""

    node: str
    rank: int | None
    reason: str
    exit_code: int | None
    kind: str
    then: str | None
    hint: str | None
    exception: str | None  # the root cause's exception line
    traceback: tuple[str, ...]
    last_lines: tuple[str, ...]
    at: float | None  # when the cause rank ended, if its end was recorded


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose stacks were identical at the teardown, and those stacks."""

    ranks: str  # "0-2,5"
    count: int
    nodes: tuple[str, ...]
    majority: bool
    threads: tuple[tuple[str, tuple[str, ...]], ...]  # (thread name, frames innermost first)


@dataclass(frozen=True)
class Stacks:
    path: str  # relative to the run directory
    groups: tuple[StackGroup, ...]
    problems: tuple[str, ...]  # nodes or ranks whose stacks could not be taken or read


@dataclass(frozen=True)
class Profile:
    """The latest sampling profile kept (`orch stacks --profile`, or orch's own while the
    job ran): who waits least."""

    path: str
    taken_at: str
    seconds: float | None
    verdict: str
    straggler_at: tuple[int, str] | None  # (rank, node); None when no rank stands apart
    taken_by: str  # "orch stacks --profile", or orch while the job ran
    complete: bool  # every node and rank was read: "no rank stands apart" can be said
    hottest: str | None  # the straggler's hottest frame of the user's code
    ranks: tuple[tuple[int, str, float], ...]  # (rank, node, share of samples waiting)

    @property
    def straggler(self) -> str | None:
        """"rank 3 on n2", or None."""
        return None if self.straggler_at is None else "rank {} on {}".format(*self.straggler_at)

    @property
    def waited_for(self) -> str | None:
        """The straggler in words, with the share the others wait; None when none."""
        if self.straggler_at is None:
            return None
        rank, node = self.straggler_at
        own = next((share for r, _node, share in self.ranks if r == rank), 0.0)
        others = [share for r, _node, share in self.ranks if r != rank]
        return waited_for_words(rank, node, own, others, self.hottest)


@dataclass(frozen=True)
class Series:
    """One rank's progress over time, from its bars and lines (logs/progress.py)."""

    node: str
    rank: int
    points: tuple[tuple[float, int], ...]  # (time, n)
    total: int | None
    step_s: float | None  # seconds per step, over the samples where it moved on


@dataclass(frozen=True)
class Slowest:
    rank: int
    node: str
    step_s: float
    median_s: float

    @property
    def ratio(self) -> float:
        return self.step_s / self.median_s if self.median_s > 0 else 1.0

    @property
    def stands_apart(self) -> bool:
        return self.ratio >= SLOWEST_RATIO

    def said(self, profiled: bool) -> str:
        """In words; `profiled`: a profile found no rank the others wait for. Without one,
        even step times say nothing: in synchronous training every rank keeps the
        slowest's pace."""
        pace = f"{_seconds(self.step_s)} per step against {_seconds(self.median_s)}"
        if not self.stands_apart:
            said = "no rank stands apart" if profiled else "step times set no rank apart"
            return (f"{said}: the slowest, rank {self.rank} on {self.node}, "
                    f"takes {self.ratio:.2f}x the median step time ({pace})")  # fmt: skip
        return (f"slowest: rank {self.rank} on {self.node}, {self.ratio:.1f}x the median "
                f"step time ({pace})")  # fmt: skip


SLOWEST_RATIO = 1.2  # a rank this much slower than the median is named as the straggler


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


@dataclass(frozen=True)
class Parity:
    """The pre-flight's findings as the job's directory keeps them (preflight.json)."""

    checks: tuple[str, ...]  # the check groups, the table's columns
    nodes: tuple[tuple[str, tuple[str, ...]], ...]  # (node, each group's status)
    differing: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...]  # fact, majority, odd
    findings: tuple[str, ...]
    seconds: float | None


@dataclass(frozen=True)
class ReportModel:
    job_id: str
    state: str
    verdict: str  # the job's end in words
    command: str
    launcher: str
    fanout: str
    shape: str  # "2 nodes × 4 ranks"
    started_at: str
    ended_at: str | None
    duration: str | None
    exit_code: int | None
    start: float | None  # the timeline's bounds
    end: float | None
    nodes: tuple[NodeRow, ...]
    cause: Cause | None
    stacks: Stacks | None
    moments: tuple[Moment, ...] = ()
    series: tuple[Series, ...] = ()
    slowest: Slowest | None = None
    profile: Profile | None = None
    parity: Parity | None = None
    attempts: tuple[AttemptRecord, ...] = ()  # every attempt; the page is the last one's
    environment: EnvironmentRecord | None = None  # the environment each node ran, by fingerprint
    hang_watch: Mapping[str, Any] | None = None  # the hang threshold in force, as recorded
    checkpoints: CheckpointsView | None = None  # None: launched without --checkpoint-dir
    stop: StopSummary | None = None  # the stop asked of the job (job.json's `stop`), if any

    @property
    def stop_lines(self) -> StopLines | None:
        """The stop's summary as the head printed it (None: the job was not stopped)."""
        return StopLines.of(self.stop) if self.stop is not None else None

    @property
    def stop_facts(self) -> str | None:
        """The stop's signal, grace and teardown, in the header's facts."""
        return settings_words(self.stop, self.start) if self.stop is not None else None

    @cached_property
    def rank_stops(self) -> Mapping[int, RankStop]:
        """Each rank's part in the stop, by rank number."""
        return {rank.rank: rank for rank in self.stop.ranks} if self.stop is not None else {}

    @property
    def hang_watch_words(self) -> str:
        """Which hang threshold was in force and where it came from, in words."""
        watch = self.hang_watch
        if not watch:
            return "not looked for"
        said = f"looked for after {float(watch['seconds']):.0f} s quiet ({watch['source']})"
        work = watch.get("quiet_work") or ()
        return said + (f"; quiet, but working: {work[-1]}" if work else "")

    @cached_property
    def _moment_times(self) -> Mapping[tuple[str, str | None, int | None], float]:
        times: dict[tuple[str, str | None, int | None], float] = {}
        for moment in self.moments:
            times.setdefault((moment.kind, moment.node, moment.rank), moment.t)
        return times

    def at(self, kind: str, node: str | None = None, rank: int | None = None) -> float | None:
        """When a moment of this kind happened (for this node or rank); its first one."""
        return self._moment_times.get((kind, node, rank))

    def first(self, kind: str) -> float | None:
        """When the first moment of this kind happened, whichever node or rank it names."""
        return next((moment.t for moment in self.moments if moment.kind == kind), None)

    @property
    def ranks(self) -> tuple[RankRecord, ...]:
        return tuple(rank for node in self.nodes for rank in node.ranks)

    @property
    def folded(self) -> bool:
        return len(self.ranks) > FOLD_RANKS_ABOVE

    @property
    def consequences(self) -> tuple[RankRecord, ...]:
        return tuple(rank for rank in self.ranks if rank.role == Role.CONSEQUENCE)

    @property
    def consequence_groups(self) -> tuple[tuple[str, str, str], ...]:
        """(node, ranks, how) for the consequences, ranks that ended alike on a node in one
        line: 130 lines of "killed by SIGTERM" say less than one."""
        groups: dict[tuple[str, str], list[int]] = {}
        for rank in self.consequences:
            groups.setdefault((rank.node, how(rank)), []).append(rank.rank)
        return tuple((node, rank_ranges(ranks), ended) for (node, ended), ranks in groups.items())
