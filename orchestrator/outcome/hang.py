"""A hang's failure, named: from a look at the quiet job (outcome/quiet.py) when it is
declared, then from the stacks taken before the teardown. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from orchestrator.outcome.quiet import QuietFinding
from orchestrator.outcome.states import HANG_EXIT_CODE, Failure, FailureKind
from orchestrator.stacks.fold import FoldedStacks, rank_ranges, steady_outliers
from orchestrator.stacks.report import StacksResult


def hang_found(quiet: str, finding: QuietFinding) -> Failure:
    """A hang as a look found it: no rank working; the rank the others wait for named when
    it alone is stopped or idle (the stacks at the teardown may name it more exactly)."""
    reason = f"{quiet} and none is working ({finding.summary()})"
    culprits = finding.culprits
    first = culprits[0] if culprits else None
    return Failure(
        first.node if first is not None else "",
        reason,
        HANG_EXIT_CODE,
        rank=first.rank if first is not None and len(culprits) == 1 else None,
        kind=FailureKind.HANG,
    )


def hang_culprit(
    failure: Failure, stacks: StacksResult | None, earlier: Sequence[FoldedStacks] = ()
) -> Failure:
    """A hang's failure naming the rank(s) whose stacks stand apart from the majority's (the
    one that stopped, while the others wait for it in a collective), and where they stand.
    `earlier`: the looks before the last; a rank is named when it stood apart in each."""
    if stacks is None or stacks.folded is None:
        return replace(failure, reason=f"{failure.reason}; the ranks' stacks could not be taken")
    folded, unread = stacks.folded, _unread(stacks)
    if not folded.outliers:
        return replace(failure, reason=f"{failure.reason}; no rank's stack stands apart{unread}")
    apart = steady_outliers(folded, earlier)
    named = ", ".join(
        f"rank {o.rank} on {o.node}" + (f" at {o.frame.where}" if o.frame else "")
        for o in apart[:4]
    )
    more = f" and {len(apart) - 4} more" if len(apart) > 4 else ""
    return replace(
        failure,
        node=apart[0].node,
        rank=apart[0].rank if len(apart) == 1 else None,
        reason=f"{failure.reason}; stands apart: {named}{more}{unread}",
    )


def _unread(stacks: StacksResult) -> str:
    """Whose stacks could not be taken, and why (the first reason), or nothing."""
    failed_nodes = [node for node in stacks.nodes if node.error is not None]
    failed_ranks = [rank for rank in stacks.ranks if not rank.ok]
    parts = []
    if failed_nodes:
        parts.append(f"{', '.join(node.node for node in failed_nodes)} did not answer "
                     f"({failed_nodes[0].error})")  # fmt: skip
    if failed_ranks:
        numbers = rank_ranges(rank.rank for rank in failed_ranks)
        parts.append(f"the stacks of rank(s) {numbers} could not be taken "
                     f"({failed_ranks[0].error or 'no answer'})")  # fmt: skip
    return "".join(f"; {part}" for part in parts)
