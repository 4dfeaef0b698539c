"""A sampling profile of every rank: time in communication against the rest, and the
straggler. Pure.

In synchronous training every rank advances at the slowest rank's pace: the others
reach each collective first and wait in it, the straggler does not. So the straggler
is the rank with the smallest share of its samples inside communication, provided the
difference is clear: it must wait at least STRAGGLER_MARGIN (20 percentage points)
less than every other rank. Two ranks equally slow, or ranks that all wait about as
much, give no straggler.

Only the rank's main thread counts (the one that trains); its samples include the time
it is idle (py-spy --idle), since a rank blocked in a collective is idle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.stacks.model import Frame, RankStacks, SampledStack, innermost_user_frame

STRAGGLER_MARGIN = 0.20

# torch.distributed's collectives, point-to-point calls and waits (c10d and its wrappers).
TORCH_COMM_FUNCTIONS = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_gather_coalesced", "_all_gather_base", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all", "all_to_all_single",
    "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
    "_store_based_barrier", "reduce", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv", "send_object_list",
    "recv_object_list", "batch_isend_irecv", "wait", "wait_all", "_wait_for_workers",
})  # fmt: skip
# Packages whose every frame is communication.
COMM_PATHS = ("deepspeed/comm/", "torch/distributed/_functional_collectives")
# Native frames (py-spy --native) of the communication libraries.
COMM_NATIVE_WORDS = ("gloo", "nccl", "c10d::")


def _in_torch_distributed(path: str) -> bool:
    return path.startswith("torch/distributed/") or "/torch/distributed/" in path


def is_comm_frame(frame: Frame) -> bool:
    """Whether a frame is communication: a torch.distributed collective, a wait on one,
    DeepSpeed's comm layer, or a gloo/NCCL native frame."""
    if any(path in frame.file for path in COMM_PATHS):
        return True
    lowered = frame.function.lower()
    native = not frame.file.endswith(".py")
    if native and any(word in lowered for word in COMM_NATIVE_WORDS):
        return True
    name = frame.function.rsplit(".", 1)[-1]
    return name in TORCH_COMM_FUNCTIONS and _in_torch_distributed(frame.file)


def is_comm_stack(frames: Sequence[Frame]) -> bool:
    return any(is_comm_frame(frame) for frame in frames)


@dataclass(frozen=True)
class RankProfile:
    rank: int
    node: str
    samples: int
    comm_samples: int
    hottest: Frame | None  # the user's frame most samples outside communication were in
    hottest_samples: int

    @property
    def comm_share(self) -> float:
        return self.comm_samples / self.samples if self.samples else 0.0


def _training_samples(samples: Sequence[SampledStack]) -> list[SampledStack]:
    main = [sample for sample in samples if sample.main]
    return main or list(samples)


def rank_profile(rank: RankStacks) -> RankProfile:
    samples = _training_samples(rank.samples)
    comm = sum(sample.count for sample in samples if is_comm_stack(sample.frames))
    outside: Counter[Frame] = Counter()
    for sample in samples:
        frame = innermost_user_frame(sample.frames)
        if frame is not None and not is_comm_stack(sample.frames):
            outside[frame] += sample.count
    hottest, hottest_samples = outside.most_common(1)[0] if outside else (None, 0)
    return RankProfile(
        rank=rank.rank, node=rank.node, samples=sum(sample.count for sample in samples),
        comm_samples=comm, hottest=hottest, hottest_samples=hottest_samples,
    )  # fmt: skip


@dataclass(frozen=True)
class StragglerVerdict:
    straggler: RankProfile | None
    reason: str
    margin: float = STRAGGLER_MARGIN


def straggler_verdict(
    profiles: Sequence[RankProfile], margin: float = STRAGGLER_MARGIN
) -> StragglerVerdict:
    sampled = sorted((p for p in profiles if p.samples), key=lambda p: (p.comm_share, p.rank))
    if len(sampled) < 2:
        return StragglerVerdict(None, "fewer than two ranks were sampled", margin)
    least, next_least = sampled[0], sampled[1]
    gap = round(next_least.comm_share - least.comm_share, 9)  # 0.7 - 0.5 is 0.2, not 0.19999
    if gap < margin:
        return StragglerVerdict(
            None,
            f"no clear straggler: rank {least.rank} waits least ({least.comm_share:.0%} of "
            f"its samples in communication), but rank {next_least.rank} waits only "
            f"{gap * 100:.0f} points more; a straggler waits at least {margin * 100:.0f} "
            "points less than every other rank",
            margin,
        )
    return StragglerVerdict(
        least,
        f"rank {least.rank} on {least.node} waits {least.comm_share:.0%} of its time in "
        f"communication; every other rank waits at least {next_least.comm_share:.0%}, for it",
        margin,
    )


def waited_for_words(rank: int, node: str, own: float, others: Sequence[float],
                     where: str | None) -> str:  # fmt: skip
    """The rank the others wait for, the share of their time they wait and where it stands:
    `waited for: rank 4 on n3 (the other ranks wait 61-68% of their time in communication,
    it 9%), at train.py:40 step`."""
    low, high = (min(others), max(others)) if others else (0.0, 0.0)
    span = f"{low:.0%}" if round(low * 100) == round(high * 100) else f"{low * 100:.0f}-{high:.0%}"
    at = f", at {where}" if where else ""
    return (f"waited for: rank {rank} on {node} (the other ranks wait {span} of their time "
            f"in communication, it {own:.0%}){at}")  # fmt: skip


def verdict_words(profiles: Sequence[RankProfile], verdict: StragglerVerdict) -> str:
    """A profile in one line: who the others wait for, or that no rank stands apart."""
    found = verdict.straggler
    if found is None:
        return f"no rank stands apart: {verdict.reason}"
    others = [p.comm_share for p in profiles if p.samples and p.rank != found.rank]
    where = found.hottest.where if found.hottest is not None else None
    return waited_for_words(found.rank, found.node, found.comm_share, others, where)


# ----- as JSON --------------------------------------------------------------------------
def profile_json(profiles: Sequence[RankProfile], verdict: StragglerVerdict) -> dict[str, Any]:
    straggler = verdict.straggler
    return {
        "margin": verdict.margin,
        "ranks": [
            {
                "rank": p.rank,
                "node": p.node,
                "samples": p.samples,
                "comm_samples": p.comm_samples,
                "comm_share": round(p.comm_share, 4),
                "hottest_user_frame": p.hottest.where if p.hottest else None,
                "hottest_samples": p.hottest_samples,
            }
            for p in profiles
        ],
        "straggler": (
            {
                "rank": straggler.rank,
                "node": straggler.node,
                "comm_share": round(straggler.comm_share, 4),
                "hottest_user_frame": straggler.hottest.where if straggler.hottest else None,
            }
            if straggler
            else None
        ),
        "verdict": verdict.reason,
    }
