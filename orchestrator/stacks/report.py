"""One call of `orch stacks` as a value, and the one JSON document it prints and keeps. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.specs.constants import SCHEMA_VERSION
from orchestrator.stacks.fold import FoldedStacks, fold_ranks, folded_json
from orchestrator.stacks.model import NodeReport, RankStacks, all_ranks
from orchestrator.stacks.profile import (
    RankProfile,
    StragglerVerdict,
    profile_json,
    rank_profile,
    straggler_verdict,
    verdict_words,
)

STACKS_SCHEMA = "orch.stacks"  # as `orch stacks --json` names its document


@dataclass(frozen=True)
class StacksResult:
    job_id: str
    taken_at: str
    seconds: float | None  # None: one dump of every rank; else a profile that long
    nodes: tuple[NodeReport, ...]
    folded: FoldedStacks | None = None
    profiles: tuple[RankProfile, ...] = ()
    verdict: StragglerVerdict | None = None

    @property
    def ok(self) -> bool:
        """Every node answered and every rank on it could be read."""
        return all(node.ok for node in self.nodes)

    @property
    def ranks(self) -> list[RankStacks]:
        return all_ranks(self.nodes)


def analyse(
    job_id: str, taken_at: str, seconds: float | None, nodes: Sequence[NodeReport]
) -> StacksResult:
    ranks = all_ranks(nodes)
    if seconds is None:
        return StacksResult(job_id, taken_at, None, tuple(nodes), folded=fold_ranks(ranks))
    profiles = tuple(rank_profile(rank) for rank in ranks if rank.ok)
    verdict = straggler_verdict(profiles)
    return StacksResult(job_id, taken_at, seconds, tuple(nodes), profiles=profiles, verdict=verdict)


def _rank_json(rank: RankStacks) -> dict[str, Any]:
    doc: dict[str, Any] = {"rank": rank.rank, "pid": rank.pid, "ok": rank.ok}
    if rank.method:
        doc["method"] = rank.method
    if not rank.ok:
        doc.update(error=rank.error, kind=rank.kind, hint=rank.hint)
    return doc


def _node_json(node: NodeReport) -> dict[str, Any]:
    doc: dict[str, Any] = {"node": node.node, "ok": node.ok}
    if node.error:
        doc.update(error=node.error, kind=node.kind, hint=node.hint)
    doc["ranks"] = [_rank_json(rank) for rank in node.ranks]
    return doc


def result_json(result: StacksResult) -> dict[str, Any]:
    doc: dict[str, Any] = {
        # Kept in the job's record as printed by `orch stacks --json`: named by its schema.
        "schema": STACKS_SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "job": result.job_id,
        "taken_at": result.taken_at,
        "mode": "dump" if result.seconds is None else "profile",
        "seconds": result.seconds,
        "ok": result.ok,
        "nodes": [_node_json(node) for node in result.nodes],
    }
    if result.folded is not None:
        doc["stacks"] = folded_json(result.folded)
    if result.verdict is not None:
        doc["profile"] = profile_json(result.profiles, result.verdict)
    return doc


def profile_words(result: StacksResult) -> str:
    """A profile in one line for the live view: who the others wait for, or that no rank
    stands apart; a profile that could not read every node or rank says so, and names no
    rank apart from what it did not read."""
    verdict = result.verdict
    unread = [node.error or f"{node.node}: a rank could not be read"
              for node in result.nodes if not node.ok]  # fmt: skip
    missing = f" ({'; '.join(unread)})" if unread else ""
    if verdict is not None and verdict.straggler is not None:
        return f"profile: {verdict_words(result.profiles, verdict)}{missing}"
    if unread or verdict is None:
        return f"profile: incomplete, no rank named{missing}"
    return f"profile: {verdict_words(result.profiles, verdict)}"


def merged_looks(earlier: StacksResult, later: StacksResult) -> StacksResult:
    """Two dumps of the same job as one: each node's answer from the later look where it
    answered in full, else from the earlier one where that did (a node slow to answer once,
    under load, still counts), folded again."""
    before = {node.node: node for node in earlier.nodes}
    nodes = [
        node if node.ok or node.node not in before or not before[node.node].ok
        else before[node.node]
        for node in later.nodes
    ]
    return analyse(later.job_id, later.taken_at, None, nodes)


def needs_another_look(result: StacksResult | None) -> bool:
    """A hang's dump that does not single out the stuck rank(s) cleanly: a rank unread, or
    not exactly one block apart from a majority (a rank caught between two calls looks
    apart once, not twice)."""
    if result is None or result.folded is None or not result.ok:
        return True
    folded = result.folded
    return folded.majority is None or len(folded.blocks) != 2

