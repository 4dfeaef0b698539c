"""What a restart resumed from, in the one sentence the head, `orch checkpoints` and the
job's page share: the checkpoint and the nodes it was staged on, the nodes it could not be
staged on, what was set aside, what was skipped and why; or that it started from scratch,
and why."""

from __future__ import annotations

from orchestrator.checkpoints.resumed import REASONS_SAID, resumed_words

LOST = "step_90: the part written by n2 was not copied yet"


def test_a_resume_names_the_checkpoint_and_the_nodes_it_was_staged_on() -> None:
    said = resumed_words(2, "global_step100", staged=("n2", "n3", "n4"), sent_bytes=3 << 30)
    assert said == ("attempt 2 resumes from global_step100, staged on 3 of 3 nodes "
                    "(n[2-4], 3.0 GiB sent)")  # fmt: skip


def test_a_resume_says_where_staging_failed_what_was_set_aside_and_skipped() -> None:
    said = resumed_words(3, "step_60", staged=("n1",), sent_bytes=0,
                         failed={"n5": "n5: no answer"}, set_aside=("step_90",),
                         skipped=(LOST,))  # fmt: skip
    assert said == (
        "attempt 3 resumes from step_60, staged on 1 of 2 nodes (n1, 0 B sent); NOT on n5: "
        "n5: no answer; newer, not whole, moved to .orch-set-aside/ in the checkpoint "
        "directory: step_90; skipped step_90: the part written by n2 was not copied yet"
    )


def test_from_scratch_says_why_from_the_skipped_or_the_records_words() -> None:
    lost = ("step_90: the part written by n2 is held by no node alive",)
    assert resumed_words(2, None, skipped=lost) == f"attempt 2 starts from scratch: {lost[0]}"
    assert resumed_words(2, None) == (
        "attempt 2 starts from scratch: no complete checkpoint was copied yet")
    # A record written before the skipped reasons were kept: its own words.
    assert resumed_words(2, None, why="from scratch: no copy survived") == (
        "attempt 2 starts from scratch: no copy survived")


def test_many_reasons_are_counted_past_the_first_few() -> None:
    reasons = tuple(f"step_{i}: lost" for i in range(REASONS_SAID + 4))
    said = resumed_words(2, None, skipped=reasons)
    assert said.endswith(f"step_{REASONS_SAID - 1}: lost; and 4 more")
    assert f"step_{REASONS_SAID}:" not in said
