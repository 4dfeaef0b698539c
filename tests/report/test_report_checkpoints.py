"""The job's checkpoints on its page (--checkpoint-dir), from a run directory with a
checkpoints.json written here: the model's summary, rows and restarts, each checkpoint's
mark on the timeline where it became complete with a tooltip saying its size, whether it is
complete and where its copies are; the restart's sentence the same as the head's and
`orch checkpoints`'; a page of 1000 ranks and 150 checkpoints kept readable."""

from __future__ import annotations

import re
from dataclasses import replace
from html import unescape
from itertools import pairwise

import pytest
from _report_checkpoints import (
    BEING_WRITTEN,
    NEWEST,
    SKIPPED,
    checkpoints_record,
    entry,
    with_checkpoints,
)
from _report_job import T0, failed_job

from orchestrator.cli.jobs.checkpoints_cmds import restarts_lines
from orchestrator.report import build_report, render_html
from orchestrator.report.checkpoints import (
    CHAR_PX,
    CLUSTER_PX,
    ROWS_SHOWN,
    checkpoints_view,
    lane_marks,
)
from orchestrator.report.clock import since
from orchestrator.report.timeline import LABEL_W, PLOT_W, WIDTH, timeline

RESUMED = (f"attempt 2 resumes from {NEWEST}, staged on 2 of 2 nodes (n[1-2], 64.0 MiB sent); "
           f"skipped {SKIPPED}")  # fmt: skip


# Checkpoints of 125 nodes each, 30 ms apart: far more than the axis can tell apart. (The
# record of each is every node's part with its files' sha256: 150 of them make 6 MB.)
MANY = 150


@pytest.fixture
def run(tmp_path):
    return with_checkpoints(failed_job(tmp_path / "runs"), checkpoints_record())


def test_the_model_counts_the_checkpoints_and_names_the_newest_complete(run):
    view = build_report(run.path).checkpoints
    assert view is not None and view.problem is None
    assert view.summary == (f"4 checkpoints (2 complete, 1 not complete, 1 deleted by the "
                            f"job); the newest complete: {NEWEST} (128.0 MiB); 384.0 MiB "
                            "copied between nodes")  # fmt: skip
    assert view.settings == "checkpoints in /data/ckpt: 1 copy on another node, at most 200 MB/s"
    assert [(row.name, row.state) for row in view.shown] == [
        (f"{BEING_WRITTEN}/", "incomplete"), (f"{NEWEST}/", "complete"),
        ("global_step5/", "complete"), ("global_step2/", "deleted")]  # fmt: skip


def test_a_restart_says_what_it_resumed_from_as_the_head_and_orch_checkpoints_do(run):
    record = checkpoints_record()
    [restore] = build_report(run.path).checkpoints.restores  # type: ignore[union-attr]
    assert restore.sentence == RESUMED == record.restores[0].sentence
    assert restarts_lines(record)[1] == RESUMED  # `orch checkpoints JOB`
    assert restore.nodes == ("n1: sent 64.0 MiB (1 file); 1 file already there",
                             "n2: sent 0 B (0 files); 1 file already there")  # fmt: skip
    html = render_html(build_report(run.path))
    said = re.search(r'<li data-attempt="2"><span class="resumed">([^<]*)</span>', html)
    assert said is not None and unescape(said.group(1)) == RESUMED


def test_each_checkpoint_is_marked_where_it_became_complete_with_its_facts(run):
    model = build_report(run.path)
    drawn = timeline(model)
    assert drawn is not None and model.start is not None
    marks = {mark.label: mark for mark in drawn.checkpoints}
    start, span = model.start, (model.end or 0) - model.start

    def x(t: float) -> float:
        return round(LABEL_W + PLOT_W * (t - start) / span, 1)

    assert marks[NEWEST].x == x(T0 + 8.5) and marks[NEWEST].kind == "complete"
    assert marks[NEWEST].title == (
        f"{NEWEST}/: 128.0 MiB; complete {since(start, T0 + 8.5)} (deepspeed latest); "
        "written by n[1-2]; copies on n[1-2]")  # fmt: skip
    # Deleted by its writer: still placed when it was complete; never complete: first seen.
    assert marks["global_step2"].x == x(T0 + 3.0) and marks["global_step2"].kind == "deleted"
    assert "deleted by its writer" in marks["global_step2"].title
    written = marks[BEING_WRITTEN]
    assert written.x == x(T0 + 11.0) and written.kind == "incomplete"
    assert "NOT complete" in written.title and "being written" in written.title
    assert "no copy on another node" in written.title
    restart = marks[f"from {NEWEST}"]
    assert restart.kind == "restore" and restart.title.endswith(RESUMED)
    assert all(mark.label_x is not None for mark in drawn.checkpoints)  # room for each name


def test_the_html_draws_the_lane_the_section_and_the_header_line(run):
    html = render_html(build_report(run.path))
    lane = re.search(r'<svg class="checkpoints".*?</svg>', html, re.S)
    assert lane is not None
    titles = [unescape(t) for t in re.findall(r"<title>([^<]*)</title>", lane.group(0))]
    assert any(t.startswith(f"{NEWEST}/: 128.0 MiB; complete") for t in titles)
    assert re.findall(r'<g class="ck-mark" data-kind="(\w+)"', lane.group(0)) == [
        "deleted", "complete", "complete", "incomplete", "restore"]  # fmt: skip
    assert f'>{NEWEST}</text>' in lane.group(0)
    assert '<section id="checkpoints">' in html and 'id="checkpoints-summary"' in html
    assert f'data-checkpoint="{NEWEST}/"' in html


def test_a_job_without_checkpoints_has_neither_lane_nor_section(tmp_path):
    run = failed_job(tmp_path / "runs")
    model = build_report(run.path)
    assert model.checkpoints is None
    html = render_html(model)
    assert 'id="checkpoints"' not in html and 'class="checkpoints"' not in html


def test_an_unreadable_record_is_named_and_the_page_goes_on(run):
    (run.path / "checkpoints.json").write_text('{"dir": "/data/ckpt"}')
    model = build_report(run.path)
    assert model.checkpoints is not None and model.checkpoints.problem is not None
    assert "not a record of checkpoints orch can read" in model.checkpoints.problem
    assert model.checkpoints.problem in unescape(render_html(model))


def test_a_restart_from_scratch_says_why(tmp_path):
    record = checkpoints_record()
    scratch = replace(record.restores[0], entry=None, nodes={},
                      why=f"from scratch: {SKIPPED}")  # fmt: skip
    run = with_checkpoints(failed_job(tmp_path / "runs"), replace(record, restores=(scratch,)))
    model = build_report(run.path)
    [restore] = model.checkpoints.restores  # type: ignore[union-attr]
    assert restore.sentence == f"attempt 2 starts from scratch: {SKIPPED}"
    drawn = timeline(model)
    assert drawn is not None
    assert "from scratch" in [mark.label for mark in drawn.checkpoints]


def test_a_checkpoint_complete_after_the_last_rank_ended_is_still_on_the_axis(tmp_path):
    record = checkpoints_record()
    late = entry("global_step99", T0 + 40.0, T0 + 45.0)
    run = with_checkpoints(failed_job(tmp_path / "runs"),
                           replace(record, checkpoints=(*record.checkpoints, late)))  # fmt: skip
    model = build_report(run.path)
    assert model.end is not None and model.end >= T0 + 45.0
    drawn = timeline(model)
    assert drawn is not None
    assert max(mark.x for mark in drawn.checkpoints) <= LABEL_W + PLOT_W


def test_1000_ranks_and_150_checkpoints_stay_readable(tmp_path):
    record = checkpoints_record(nodes=125)
    many = tuple(entry(f"global_step{i}", T0 + 1.0 + 0.03 * i, T0 + 1.2 + 0.03 * i, 125)
                 for i in range(MANY))  # fmt: skip
    record = replace(record, checkpoints=(*many, *record.checkpoints[2:]))
    run = with_checkpoints(failed_job(tmp_path / "runs", nodes=125, per_node=8), record)
    model = build_report(run.path)
    view = model.checkpoints
    assert view is not None and len(view.rows) == MANY + 2 and len(view.shown) == ROWS_SHOWN
    # Node lists fold: 125 writers are one short name.
    assert {row.writers for row in view.rows} == {"n[1-125]"}
    drawn = timeline(model)
    assert drawn is not None
    marks = drawn.checkpoints
    assert len(marks) <= PLOT_W / CLUSTER_PX + len(view.restores)
    assert sum(mark.count for mark in marks if mark.kind != "restore") == MANY + 2
    folded = [mark for mark in marks if mark.count > 1]
    assert folded and all(re.match(r"\d+ checkpoints \+", mark.title) for mark in folded)
    # Labels never overlap: each starts after the one before ends.
    placed = sorted((m.label_x, m.label) for m in marks if m.label_x is not None)
    assert all(a[0] + CHAR_PX * len(a[1]) < b[0] for a, b in pairwise(placed))
    assert all(at >= LABEL_W and at + CHAR_PX * len(label) <= WIDTH for at, label in placed)
    html = render_html(model)
    assert html.count('class="ck-mark"') == len(marks)
    assert html.count("data-checkpoint=") == ROWS_SHOWN
    assert f"The newest {ROWS_SHOWN} of {MANY + 2} checkpoints" in html
    assert len(html.encode()) < 2_000_000


def test_marks_closer_than_a_few_pixels_fold_into_one():
    view = checkpoints_view(checkpoints_record(), T0)
    marks = lane_marks(view, lambda t: round(LABEL_W + (t - T0) * 0.1, 1), T0, LABEL_W, WIDTH)
    [together] = [mark for mark in marks if mark.kind != "restore"]
    assert together.count == 4 and together.label == "4 checkpoints"
    assert together.title == ("4 checkpoints +3.0s to +11.0s, 2 complete: global_step2, "
                              "global_step5, global_step8, global_step11")


def test_a_name_saved_again_and_again_is_marked_at_each_save(tmp_path):
    """`last.pt` saved in place three times: a mark at each save, the last one being
    written again when the job ended; the table says how many saves made it complete."""
    record = checkpoints_record()
    saves = (T0 + 2.0, T0 + 6.0, T0 + 10.0)
    last = replace(entry("last.pt", T0 + 1.0, None, how="changed 2 s ago"), kind="file",
                   completions=saves)  # fmt: skip
    run = with_checkpoints(failed_job(tmp_path / "runs"),
                           replace(record, checkpoints=(last,), restores=()))  # fmt: skip
    model = build_report(run.path)
    drawn = timeline(model)
    assert drawn is not None and model.start is not None
    marks = [mark for mark in drawn.checkpoints if mark.label == "last.pt"]
    assert [mark.kind for mark in marks] == ["complete"] * 3
    assert [mark.title.split("; ")[1] for mark in marks] == [
        f"complete {since(model.start, t)} (save {i} of 3)" for i, t in enumerate(saves, 1)]
    assert marks[-1].title.endswith("being written again, NOT complete now: changed 2 s ago; "
                                    "written by n[1-2]; no copy on another node")  # fmt: skip
    [row] = model.checkpoints.rows  # type: ignore[union-attr]
    assert row.at == f"{since(model.start, saves[-1])} (3 saves)"
    assert row.complete == "no: changed 2 s ago"
    assert model.checkpoints.summary.startswith(  # type: ignore[union-attr]
        f"1 checkpoint (1 not complete); none complete now (last.pt was complete "
        f"{since(model.start, saves[-1])}, then written again)")  # fmt: skip


def test_a_restarts_label_wins_over_a_checkpoint_it_would_overlap():
    record = checkpoints_record()
    near = replace(record, checkpoints=record.checkpoints[2:3],
                   restores=(replace(record.restores[0], at=T0 + 9.0),))  # fmt: skip
    view = checkpoints_view(near, T0)
    marks = lane_marks(view, lambda t: round(LABEL_W + (t - T0) * 10, 1), T0, LABEL_W, WIDTH)
    assert [(mark.kind, mark.label_x is not None) for mark in marks] == [
        ("complete", False), ("restore", True)]  # fmt: skip
    assert marks[0].title.startswith(f"{NEWEST}/")  # still named, in its tooltip
