"""The allocation's end as Slurm's answers give it (outcome/allocation.py): only an end brought
forward is a move, and the stop it asks for comes before that end, not at once."""

from __future__ import annotations

import pytest

from orchestrator.outcome.allocation import AllocationEnd
from orchestrator.specs.slurm import SLURM_STOP_MARGIN_S


@pytest.mark.parametrize(
    ("answers", "moved_to", "due_at"),
    [
        # squeue's whole seconds and a slow answer: the end has not moved.
        ([(600, 0), (589, 10.5), (575, 22)], None, None),
        # A limit raised: nothing to stop for.
        ([(600, 0), (7200, 10)], None, None),
        # A limit shortened to an hour: the stop comes before that end, not now.
        ([(36000, 0), (3600, 10)], 3610, 3610 - 120 - SLURM_STOP_MARGIN_S),
    ],
)  # fmt: skip
def test_only_an_end_brought_forward_is_a_move(answers, moved_to, due_at):
    end = AllocationEnd()
    for left, at in answers:
        end.answered(left, at)
    assert end.moved_to == moved_to
    assert end.stop_due(10_000, 120) == (moved_to is not None)
    if due_at is not None:
        assert not end.stop_due(due_at - 1, 120) and end.stop_due(due_at, 120)
