"""What came of a stop (the first Ctrl-C, `orch stop`, the time limit): which ranks exited
by themselves within the grace, how long they took, which were still running when the job
was torn down. job.json keeps it as `stop`; the summary prints its lines. Pure: the ranks'
ends (outcome/rank_ends.py) and the times the stop signal reached them in, on the head's
clock, a summary out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from orchestrator.outcome.rank_ends import RankEnd
from orchestrator.outcome.states import StopCause
from orchestrator.specs.stop import StopSettings
from orchestrator.specs.words import StrEnum


class StopEnding(StrEnum):
    """How the stop ended."""

    RANKS_EXITED = "ranks-exited"  # every node's ranks exited within the grace
    GRACE_OVER = "grace-over"  # the grace ran out: what was left was torn down
    CUT_SHORT = "cut-short"  # a second Ctrl-C, `orch kill` or a signal on the head: at once


class RankStopEnd(StrEnum):
    """How one rank ended after the stop."""

    EXITED = "exited"  # by itself, exit code 0
    FAILED = "failed"  # by itself, another exit code
    STOP_SIGNAL = "stop-signal"  # the stop signal ended it: it has no handler for it
    KILLED = "killed"  # still running when the job was torn down
    UNKNOWN = "unknown"  # its end was never reported (its node was lost)


BY_ITSELF = (RankStopEnd.EXITED, RankStopEnd.FAILED)


@dataclass(frozen=True)
class RankStop:
    rank: int
    node: str | None
    signalled_at: float | None  # when the stop signal was sent to it (None: it was not)
    ended_at: float | None
    exit_code: int | None  # as a shell reports it: 128 + N for signal N
    end: RankStopEnd


@dataclass(frozen=True)
class StopSummary:
    """A stop, as job.json keeps it: times are seconds since the epoch on the head's clock."""

    cause: StopCause
    asked_at: float
    signal: str
    grace: float
    ending: StopEnding
    torn_down_at: float | None = None  # the teardown began (the grace ran out, or cut short)
    ranks: tuple[RankStop, ...] = ()
    unreached: Mapping[str, str] = field(default_factory=dict)  # node -> why no signal
    cut: str = ""  # why the grace was shorter than the one asked for ("": it was not)

    @property
    def by_themselves(self) -> tuple[RankStop, ...]:
        return tuple(r for r in self.ranks if r.end in BY_ITSELF)

    @property
    def killed_when(self) -> str:
        """When the ranks still running were killed, in words: the summary's and the page's."""
        if self.ending == StopEnding.GRACE_OVER:
            if self.cut:
                return f"at the end of the {self.grace:.0f} s grace ({self.cut})"
            return f"at the end of the {self.grace:g} s grace"
        return "when the stop was cut short"

    def _within(self) -> float:
        ends = [r.ended_at for r in self.by_themselves if r.ended_at is not None]
        return max(0.0, max(ends, default=self.asked_at) - self.asked_at)

    def lines(self) -> list[str]:
        """`stopped by Ctrl-C: 6 of 6 ranks exited by themselves within 41 s`, then each
        rank that did otherwise."""
        mine = self.by_themselves
        head = (f"stopped by {self.cause.said}: {len(mine)} of {len(self.ranks)} ranks exited "
                f"by themselves within {self._within():.0f} s")  # fmt: skip
        if self.ending == StopEnding.CUT_SHORT:
            head += " (the stop was cut short)"
        lines = [head]
        for rank in self.ranks:
            where = f"rank {rank.rank}" + (f" on {rank.node}" if rank.node else "")
            if rank.end == RankStopEnd.FAILED:
                lines.append(f"  {where} exited with code {rank.exit_code}")
            elif rank.end == RankStopEnd.STOP_SIGNAL:
                lines.append(f"  {where} was ended by {self.signal} itself: the script had "
                             "no handler for it then")  # fmt: skip
        killed = [r for r in self.ranks if r.end == RankStopEnd.KILLED]
        if killed:
            lines.append(f"  killed {self.killed_when}: {_ranks_text(killed)}")
        unknown = [r for r in self.ranks if r.end == RankStopEnd.UNKNOWN]
        if unknown:
            lines.append(f"  never reported an end: {_ranks_text(unknown)}")
        lines += [f"  {node}: the stop signal was not sent: {why}"
                  for node, why in self.unreached.items()]  # fmt: skip
        return lines

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["ranks"] = [asdict(rank) for rank in self.ranks]
        doc["unreached"] = dict(self.unreached)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping | None) -> StopSummary | None:
        if not doc:
            return None
        ranks = tuple(RankStop(**{**r, "end": RankStopEnd(r["end"])}) for r in doc["ranks"])
        return cls(**{**doc, "cause": StopCause(doc["cause"]), "ending": StopEnding(doc["ending"]),
                      "ranks": ranks, "unreached": dict(doc.get("unreached") or {})})  # fmt: skip


def _ranks_text(ranks: Sequence[RankStop]) -> str:
    by_node: dict[str | None, list[int]] = {}
    for rank in ranks:
        by_node.setdefault(rank.node, []).append(rank.rank)
    return "; ".join(f"{'rank' if len(found) == 1 else 'ranks'} "
                     f"{', '.join(map(str, found))}" + (f" on {node}" if node else "")
                     for node, found in by_node.items())  # fmt: skip


def rank_stop(rank: int, end: RankEnd | None, signalled: tuple[str, float] | None,
              torn_down_at: float | None, signum: int) -> RankStop:  # fmt: skip
    """One rank's part in a stop, from its end (None: never reported) and when it was sent
    the stop signal (node, time)."""
    node = end.node if end is not None else signalled[0] if signalled is not None else None
    sent = signalled[1] if signalled is not None else None
    if end is None:
        return RankStop(rank, node, sent, None, None, RankStopEnd.UNKNOWN)
    if torn_down_at is not None and end.end >= torn_down_at:
        how = RankStopEnd.KILLED
    elif end.code == 0:
        how = RankStopEnd.EXITED
    elif end.signal == signum:
        how = RankStopEnd.STOP_SIGNAL
    else:
        how = RankStopEnd.FAILED
    code = None if end.code is None else end.exit_code
    return RankStop(rank, node, sent, round(end.end, 4), code, how)


def stop_summary(
    cause: StopCause, asked_at: float, stop: StopSettings, *, ending: StopEnding,
    torn_down_at: float | None, world_size: int, ends: Collection[RankEnd],
    signalled: Mapping[int, tuple[str, float]], unreached: Mapping[str, str], cut: str = "",
) -> StopSummary:  # fmt: skip
    """The stop's summary: every rank of the job (0 to world_size - 1, and any other that
    reported), from its end as its keeper reported it and when the signal was sent to it."""
    by_rank = {end.rank: end for end in ends}
    numbers = sorted({*range(world_size), *by_rank, *signalled})
    ranks = tuple(rank_stop(n, by_rank.get(n), signalled.get(n), torn_down_at, stop.signum)
                  for n in numbers)  # fmt: skip
    return StopSummary(cause, round(asked_at, 4), stop.signal, stop.grace, ending,
                       None if torn_down_at is None else round(torn_down_at, 4), ranks,
                       dict(unreached), cut)  # fmt: skip


def stopping_text(cause: StopCause, exited: int, world_size: int, elapsed: float,
                  grace: float) -> str:  # fmt: skip
    """The live view's line while the ranks save."""
    again = "Ctrl-C again" if cause == StopCause.CTRL_C else "Ctrl-C"
    return (f"stopping ({cause.said}): {exited} of {world_size} ranks exited, "
            f"{elapsed:.0f} s of the {grace:g} s grace; {again} stops at once")


@dataclass(frozen=True)
class GraceInForce:
    """A stop's grace as it stands: its seconds, and why they are fewer than the ones asked
    for ("": they are not)."""

    seconds: float
    cut: str = ""

    def ran_out(self, cause: StopCause) -> str:
        """Why the stop was torn down: its grace ran out."""
        if not self.cut:
            return f"stopped by {cause.said}: the {self.seconds:g} s grace ran out"
        return f"stopped by {cause.said}: the {self.seconds:.0f} s grace ran out ({self.cut})"


def grace_in_force(asked: float, stop_at: float | None, kills_at: float | None,
                   kill_wait: float | None) -> GraceInForce:  # fmt: skip
    """A stop's grace: the one asked for, or what is left of it before `kills_at` (Slurm's
    SIGTERM reached the head: what its KillWait leaves the ranks), and why."""
    if stop_at is None or kills_at is None or kill_wait is None or kills_at - stop_at >= asked:
        return GraceInForce(asked)
    return GraceInForce(max(0.0, kills_at - stop_at), (
        f"cut from {asked:g} s: Slurm ends the job {kill_wait:g} s after its SIGTERM, its "
        "KillWait"))  # fmt: skip
