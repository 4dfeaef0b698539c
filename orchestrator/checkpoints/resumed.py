"""What a restart resumed from, in one sentence: the line the head prints before the attempt,
`orch checkpoints JOB` and the job's page all say it with these words, so the three never
disagree. Pure: the facts come in as values (records/checkpoints.py's RestoreRecord keeps
them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.specs.inventory import nodes_text
from orchestrator.specs.units import format_bytes

NO_COPY_YET = "no complete checkpoint was copied yet"
SET_ASIDE_DIR = ".orch-set-aside"  # under --checkpoint-dir, on each node
# Reasons named in the sentence, at most: one restart can skip many newer checkpoints, and
# a line of fifty reasons is read by nobody (`orch checkpoints JOB --json` keeps every one).
REASONS_SAID = 3


def resumed_words(
    attempt: int,
    entry: str | None,
    *,
    staged: Sequence[str] = (),
    sent_bytes: int = 0,
    failed: Mapping[str, str] | None = None,
    set_aside: Sequence[str] = (),
    skipped: Sequence[str] = (),
    why: str = "",
) -> str:
    """`attempt 2 resumes from global_step100, staged on 3 of 3 nodes (n[2-4], 1.2 GiB sent)`
    or `attempt 2 starts from scratch: <why>`. `staged`: the nodes the checkpoint was put on
    whole; `failed`: node -> why staging failed there; `set_aside`: newer entries moved out
    of the way; `skipped`: why each newer checkpoint was not the one; `why`: what a record
    without `skipped` said instead (older records)."""
    if entry is None:
        reasons = list(skipped) or [why.removeprefix("from scratch: ") or NO_COPY_YET]
        return f"attempt {attempt} starts from scratch: {_reasons(reasons)}"
    failed = failed or {}
    where = nodes_text(staged) or "no node"
    sent = format_bytes(sent_bytes)
    words = (f"attempt {attempt} resumes from {entry}, staged on {len(staged)} of "
             f"{len(staged) + len(failed)} nodes ({where}, {sent} sent)")  # fmt: skip
    if failed:
        words += "; NOT on " + "; ".join(f"{node}: {problem}" for node, problem in failed.items())
    if set_aside:
        words += (f"; newer, not whole, moved to {SET_ASIDE_DIR}/ in the checkpoint "
                  f"directory: {', '.join(set_aside)}")  # fmt: skip
    if skipped:
        words += f"; skipped {_reasons(list(skipped))}"
    return words


def _reasons(reasons: list[str]) -> str:
    said = "; ".join(reasons[:REASONS_SAID])
    more = len(reasons) - REASONS_SAID
    return said + (f"; and {more} more" if more > 0 else "")
