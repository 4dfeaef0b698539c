"""Identical stacks folded across ranks, as `clush -b` folds identical output. Pure.

Two ranks share a block when their threads hold the same stacks (frame by frame, by
file:line:function; thread names are ignored). Threads py-spy calls idle are dropped
when they are not the main thread and hold no frame of the user's code (thread pools,
the standard library's workers): a rank blocked in a collective is idle too, but that
is its main thread, which is always kept. The majority is the one block bigger than
every other; the ranks outside it stand apart, and are named first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.stacks.model import Frame, RankStacks, ThreadStack, innermost_user_frame

Signature = tuple[tuple[str, ...], ...]


def kept_threads(rank: RankStacks) -> tuple[ThreadStack, ...]:
    """The threads worth showing, main thread first."""
    with_frames = [thread for thread in rank.threads if thread.frames]
    kept = [
        thread
        for thread in with_frames
        if thread.main or not thread.idle or innermost_user_frame(thread.frames) is not None
    ]
    return tuple(sorted(kept or with_frames, key=lambda thread: not thread.main))


def signature(threads: Iterable[ThreadStack]) -> Signature:
    return tuple(sorted(tuple(frame.key for frame in thread.frames) for thread in threads))


def user_frame(rank: RankStacks) -> Frame | None:
    """The innermost frame of the user's code, main thread first; else the innermost
    frame of the main thread (a rank that never left library code)."""
    threads = kept_threads(rank)
    for thread in threads:
        frame = innermost_user_frame(thread.frames)
        if frame is not None:
            return frame
    return threads[0].frames[0] if threads else None


@dataclass(frozen=True)
class StackBlock:
    """Ranks whose stacks are identical, and those stacks (as the first of them has them)."""

    ranks: tuple[RankStacks, ...]
    threads: tuple[ThreadStack, ...]

    @property
    def rank_numbers(self) -> tuple[int, ...]:
        return tuple(rank.rank for rank in self.ranks)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(rank.node for rank in self.ranks))


@dataclass(frozen=True)
class Outlier:
    """A rank whose stacks differ from the majority's."""

    rank: int
    node: str
    frame: Frame | None


@dataclass(frozen=True)
class FoldedStacks:
    blocks: tuple[StackBlock, ...]  # the ones that stand apart first, the majority last
    majority: StackBlock | None  # None when no block is bigger than every other
    outliers: tuple[Outlier, ...]
    failed: tuple[RankStacks, ...]  # ranks whose stack could not be taken


def fold_ranks(ranks: Sequence[RankStacks]) -> FoldedStacks:
    groups: dict[Signature, list[RankStacks]] = {}
    for rank in sorted(ranks, key=lambda r: r.rank):
        if rank.ok and rank.threads:
            groups.setdefault(signature(kept_threads(rank)), []).append(rank)
    blocks = [StackBlock(tuple(group), kept_threads(group[0])) for group in groups.values()]
    blocks.sort(key=lambda block: (len(block.ranks), block.ranks[0].rank))
    majority = _majority(blocks)
    outliers = tuple(
        Outlier(rank.rank, rank.node, user_frame(rank))
        for block in blocks
        if majority is not None and block is not majority
        for rank in block.ranks
    )
    failed = tuple(rank for rank in ranks if not rank.ok)
    return FoldedStacks(tuple(blocks), majority, outliers, failed)


def steady_outliers(latest: FoldedStacks, earlier: Sequence[FoldedStacks]) -> tuple[Outlier, ...]:
    """The latest look's outliers that stood apart in every earlier look that read them: a
    rank caught once between two calls is not a culprit. All of them when none was steady."""
    def apart_or_unread(rank: int, look: FoldedStacks) -> bool:
        read = {number for block in look.blocks for number in block.rank_numbers}
        return rank not in read or rank in {outlier.rank for outlier in look.outliers}

    steady = tuple(
        outlier
        for outlier in latest.outliers
        if all(apart_or_unread(outlier.rank, look) for look in earlier)
    )
    return steady or latest.outliers


def _majority(blocks: Sequence[StackBlock]) -> StackBlock | None:
    if len(blocks) < 2:
        return blocks[0] if blocks else None
    biggest, runner_up = blocks[-1], blocks[-2]
    return biggest if len(biggest.ranks) > len(runner_up.ranks) else None


def rank_ranges(numbers: Iterable[int]) -> str:
    """0,1,2,4,5 -> "0-2,4-5"."""
    ordered = sorted(set(numbers))
    spans: list[str] = []
    start = prev = None
    for number in [*ordered, None]:
        if start is not None and (number is None or number != prev + 1):
            spans.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if number is not None:
            start = number if start is None else start
            prev = number
    return ",".join(spans)


# ----- as JSON --------------------------------------------------------------------------
def thread_json(thread: ThreadStack) -> dict[str, Any]:
    return {
        "name": thread.name,
        "main": thread.main,
        "idle": thread.idle,
        "frames": [frame.to_json() for frame in thread.frames],
    }


def folded_json(folded: FoldedStacks) -> dict[str, Any]:
    return {
        "blocks": [
            {
                "ranks": list(block.rank_numbers),
                "nodes": list(block.nodes),
                "majority": block is folded.majority,
                "threads": [thread_json(thread) for thread in block.threads],
            }
            for block in folded.blocks
        ],
        "stand_apart": [
            {
                "rank": outlier.rank,
                "node": outlier.node,
                "frame": outlier.frame.where if outlier.frame else None,
            }
            for outlier in folded.outliers
        ],
    }
