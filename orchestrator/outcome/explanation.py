"""Why a job failed, told from what the head kept of its output: the failing rank (the
earliest failing end its keepers reported, outcome/rank_ends.py), its own traceback as the
root cause (outcome/rootcause.py), the last lines to show and what its end means.

run/launch.py hands it the verdict's failure and what its output tracker kept, as values,
and writes the explanation into the record's first failure. Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from orchestrator.outcome.rank_ends import (
    RankEnd,
    RankOrder,
    after_a_fault,
    end_hint,
    order_ends,
)
from orchestrator.outcome.rootcause import RankTraceback, rank_tracebacks
from orchestrator.outcome.states import Failure, FailureKind

TAIL_LINES = 15  # the last lines a failure shows: its node's, or its rank's own


@dataclass(frozen=True)
class KeptOutput:
    """What the head kept of the job's output, decoded: each node's last lines (as they
    were when the failure was seen, if the job was torn down), each rank's own last lines
    with when its last traceback began and its node, and every rank's end as its keeper
    reported it (on the head's clock)."""

    node_lines: Mapping[str, tuple[str, ...]]
    rank_lines: Mapping[int, Sequence[str]]
    traceback_at: Mapping[int, int]  # rank -> when its last traceback began
    rank_nodes: Mapping[int, str]
    rank_ends: Sequence[RankEnd]


@dataclass(frozen=True)
class Explanation:
    """A failure explained: `failure` as the ranks' own ends tell it, `order` every failing
    end's role, the lines to show, the root cause's traceback and its node, and a hint at
    what the failing rank's end means (not the script's own error)."""

    failure: Failure
    order: RankOrder
    last_lines: tuple[str, ...]
    root_cause: RankTraceback | None
    root_cause_node: str | None
    hint: str | None


def explain(failure: Failure, kept: KeptOutput) -> Explanation:
    """The failure, its cause among the ranks' ends and the root cause's traceback."""
    tracebacks = rank_tracebacks(kept.rank_lines, kept.traceback_at)
    if failure.kind == FailureKind.RANK:
        failure, order = first_rank_end(failure, kept.rank_ends, tracebacks)
    else:
        order = after_a_fault(kept.rank_ends)
    caused_by_a_rank = failure.kind in (FailureKind.RANK, FailureKind.LOST)
    root = failing_rank_traceback(failure, tracebacks) if caused_by_a_rank else None
    cause = order.cause
    return Explanation(
        failure=failure,
        order=order,
        last_lines=cause_lines(cause, kept) if cause else kept.node_lines.get(failure.node, ()),
        root_cause=root,
        root_cause_node=kept.rank_nodes.get(root.rank) if root else None,
        hint=end_hint(cause, kept.rank_lines.get(cause.rank, ())) if cause else None,
    )


def first_rank_end(
    failure: Failure, ends: Sequence[RankEnd], tracebacks: Sequence[RankTraceback]
) -> tuple[Failure, RankOrder]:
    """The failure as the ranks' own ends tell it: the earliest failing end is the cause
    (its node, rank and exit code are the job's), the later ones that lost a peer its
    consequences. Unchanged when no rank's failing end was reported."""
    lost_peer = {found.rank for found in tracebacks if found.cascade}
    order = order_ends(ends, lost_peer)
    cause = order.cause
    if cause is None:
        return failure, order
    return replace(failure, node=cause.node, rank=cause.rank, exit_code=cause.exit_code,
                   reason=cause.how(), when=cause.end), order  # fmt: skip


def cause_lines(cause: RankEnd, kept: KeptOutput) -> tuple[str, ...]:
    """The failing rank's own last lines (its node's would show its peers' cascade)."""
    lines = list(kept.rank_lines.get(cause.rank, ()))[-TAIL_LINES:]
    own = tuple(f"[r{cause.rank}] {line}" for line in lines)
    return own or kept.node_lines.get(cause.node, ())


def failing_rank_traceback(
    failure: Failure, tracebacks: Sequence[RankTraceback]
) -> RankTraceback | None:
    """The failing rank's own traceback: the earliest that is not a cascade of another
    rank's failure, or the failing rank's own. A cascade on another rank is never named
    as the cause (the failing rank may have printed none)."""
    for found in tracebacks:
        if not found.cascade or found.rank == failure.rank:
            return found
    return None
