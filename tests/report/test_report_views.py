"""What the page draws from what the job kept as it ran: the timeline's moments, progress
per rank and the slowest rank, the pre-flight's table, the straggler profile, and a page of
1000 ranks that stays readable. On values, and on the HTML."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from _report_job import CAUSE_NODE, JOB, ODD_TORCH, STRAGGLER, T0, failed_job

from orchestrator.logs.progress import Sample
from orchestrator.records.moments import Moment, MomentKind, append_moments, note_attempt
from orchestrator.report import build_report, render_html
from orchestrator.report.charts import heat_fill, progress_chart
from orchestrator.report.model import Slowest
from orchestrator.report.progress import rank_series, slowest_rank, step_time
from orchestrator.report.timeline import timeline


@pytest.fixture
def run(tmp_path):
    return failed_job(tmp_path / "runs")


def test_the_slowest_rank_is_named_in_words(run):
    slowest = build_report(run.path).slowest
    assert slowest is not None and (slowest.rank, slowest.node) == (STRAGGLER, "n1")
    assert slowest.stands_apart
    assert slowest.said(profiled=False) == (
        "slowest: rank 2 on n1, 3.0x the median step time (300 ms per step against 100 ms)"
    )
    html = render_html(build_report(run.path))
    found = re.search(r'<p id="slowest"[^>]*data-rank="2"[^>]*>([^<]*)</p>', html)
    assert found is not None and found.group(1) == slowest.said(profiled=False)


def test_ranks_that_keep_pace_have_no_straggler_but_the_slowest_is_still_said():
    even = Slowest(rank=3, node="n2", step_s=0.105, median_s=0.1)
    assert not even.stands_apart
    said = even.said(profiled=True)
    assert said.startswith("no rank stands apart: the slowest, rank 3 on n2, takes 1.05x")


def test_step_time_counts_only_steps_made_not_a_bar_that_starts_again():
    samples = [Sample(0.0, "n1", 0, 0), Sample(1.0, "n1", 0, 10), Sample(2.0, "n1", 0, 2),
               Sample(3.0, "n1", 0, 12)]  # fmt: skip
    assert step_time(samples) == pytest.approx(0.1)  # 20 steps in 2 of the 3 seconds
    assert step_time([Sample(0.0, "n1", 0, 5, 10, 4.0)]) == pytest.approx(0.25)  # its rate
    assert step_time([Sample(0.0, "n1", 0, 5)]) is None


def test_one_rank_alone_has_no_slowest():
    assert slowest_rank(rank_series([Sample(0, "n1", 0, 0), Sample(1, "n1", 0, 9)])) is None


def test_progress_is_one_line_per_rank_the_slowest_marked(run):
    chart = progress_chart(build_report(run.path))
    assert chart is not None and chart.heat == ()
    assert [line.rank for line in chart.lines] == list(range(8))
    assert [line.rank for line in chart.lines if "slowest" in line.css] == [STRAGGLER]
    straggler = next(line for line in chart.lines if line.rank == STRAGGLER)
    fast = next(line for line in chart.lines if line.rank == 0)
    last_y = [float(line.points.split()[-1].split(",")[1]) for line in (straggler, fast)]
    assert last_y[0] > last_y[1]  # fewer steps done: lower on the chart (y grows down)


def test_the_timeline_shows_preflight_outputs_heartbeats_and_teardown(run):
    drawn = timeline(build_report(run.path))
    assert drawn is not None and drawn.preflight is not None
    assert drawn.preflight[0] == drawn.plot_x  # the axis starts with the pre-flight
    assert [lane.node for lane in drawn.lanes] == ["n1", "n2"]
    assert [lane.node for lane in drawn.lanes if lane.at_fault] == [CAUSE_NODE]
    assert all(lane.open for lane in drawn.lanes)  # 2 nodes: every rank shown at once
    head = drawn.lanes[0].head
    assert {mark.kind for mark in head.marks} == {"first-output", "last-output", "last-heartbeat"}
    assert {mark.kind for row in drawn.lanes[0].ranks for mark in row.marks} == {
        "first-output", "last-output"}  # fmt: skip
    assert [line.kind for line in drawn.lines] == ["first-failure", "teardown-start",
                                                   "teardown-end"]  # fmt: skip


def test_a_restart_is_marked_on_the_timeline(run):
    note_attempt(run, T0 + 13.0, 1, "n2 stopped answering")
    drawn = timeline(build_report(run.path))
    assert drawn is not None
    restart = drawn.line("attempt")
    assert restart is not None and restart.label == "restart"
    assert restart.title == "restart +16.0s: attempt 1: n2 stopped answering"
    assert "attempt 1: n2 stopped answering" in render_html(build_report(run.path))


def test_the_preflight_parity_table_is_on_the_page(run):
    model = build_report(run.path)
    assert model.parity is not None
    assert model.parity.differing == (("torch", "2.13.0", (ODD_TORCH,)),)
    html = render_html(model)
    section = re.search(r'<section id="parity">(.*?)</section>', html, re.S)
    assert section is not None and "n2: <code>2.12.0</code>" in section.group(1)
    assert 'class="st-warning">warning<' in section.group(1)


def test_a_job_without_what_is_kept_as_it_runs_still_has_a_page(tmp_path):
    model = build_report(failed_job(tmp_path, kept=False).path)
    assert (model.series, model.slowest, model.parity, model.moments) == ((), None, None, ())
    html = render_html(model)
    assert "there is no progress to draw" in html and "without a pre-flight" in html


def test_the_straggler_profile_is_shown_when_taken(run):
    profile = {
        "job": JOB, "taken_at": "2026-11-18T00:00:10+00:00", "mode": "profile", "seconds": 5,
        "ok": True, "nodes": [],
        "profile": {"margin": 0.2, "verdict": "rank 2 on n1 waits 10% of its time",
                    "straggler": {"rank": 2, "node": "n1", "comm_share": 0.1,
                                  "hottest_user_frame": "train.py:12 forward"},
                    "ranks": [{"rank": r, "node": "n1", "comm_share": 0.1 if r == 2 else 0.8}
                              for r in range(4)]},
    }  # fmt: skip
    (run.path / "stacks" / "20261118-000010.json").write_text(json.dumps(profile))
    model = build_report(run.path)
    assert model.profile is not None and model.profile.straggler == "rank 2 on n1"
    html = render_html(model)
    assert "straggler: rank 2 on n1" in html and "train.py:12 forward" in html
    # The sentence at the top names the rank the others wait for, however even the steps.
    top = re.search(r'<p id="slowest" class="slowest apart" data-node="n1" data-rank="2">'
                    r"([^<]*)<", html)  # fmt: skip
    assert top is not None
    assert top.group(1) == ("waited for: rank 2 on n1 (the other ranks wait 80% of their time "
                            "in communication, it 10%), at train.py:12 forward (")  # fmt: skip
    assert "with <code>orch stacks --profile</code>" in html


def test_even_step_times_say_no_rank_stands_apart_only_once_a_profile_found_none(run):
    even = Slowest(rank=3, node="n2", step_s=0.105, median_s=0.1)
    assert even.said(profiled=False).startswith("step times set no rank apart: the slowest")
    profile = {
        "job": JOB, "taken_at": "2026-11-18T00:00:10+00:00", "mode": "profile", "seconds": 5,
        "ok": True, "nodes": [], "taken_by": "orch, while the job ran",
        "profile": {"margin": 0.2, "verdict": "no clear straggler", "straggler": None,
                    "ranks": [{"rank": r, "node": "n1", "comm_share": 0.5} for r in range(4)]},
    }  # fmt: skip
    (run.path / "stacks" / "20261118-000010.json").write_text(json.dumps(profile))
    html = render_html(build_report(run.path))
    # This run's rank 2 steps 3x slower: its step times name it, the profile none.
    top = '<p id="slowest" class="slowest apart" data-node="n1" data-rank="2">slowest: rank 2'
    assert top in html
    assert "by orch, while the job ran" in html


def test_a_profile_that_missed_a_node_does_not_say_no_rank_stands_apart(run):
    (run.path / "stacks" / "20261118-000010.json").write_text(json.dumps({
        "job": JOB, "taken_at": "2026-11-18T00:00:10+00:00", "mode": "profile", "seconds": 5,
        "ok": False, "profile": {"margin": 0.2, "verdict": "fewer than two ranks were sampled",
                                 "straggler": None, "ranks": []},
    }))  # fmt: skip
    even = Slowest(rank=3, node="n2", step_s=0.105, median_s=0.1)
    model = replace(build_report(run.path), slowest=even)
    assert model.profile is not None and not model.profile.complete
    html = render_html(model)
    assert ">step times set no rank apart: the slowest, rank 3 on n2" in html
    assert "no rank stands apart" not in html


def test_raw_logs_pulled_back_are_linked_relatively(run):
    raw = run.node_logs / "n2" / "rank-5.log"
    raw.parent.mkdir(parents=True)
    raw.write_text("raw\n")
    html = render_html(build_report(run.path))
    assert 'href="nodes/n2/rank-5.log"' in html


def test_1000_ranks_fold_into_a_heatmap_and_stay_small(tmp_path):
    run = failed_job(tmp_path, nodes=125, per_node=8)
    model = build_report(run.path)
    chart = progress_chart(model)
    assert model.folded and chart is not None
    assert len(chart.lines) == 125  # one line per node, not per rank
    assert len(chart.heat) == 125
    assert sorted(c.rank for row in chart.heat for c in row.cells) == list(range(1000))
    drawn = timeline(model)
    assert drawn is not None and not any(row.rank is not None for row in drawn.rows)
    assert [lane.node for lane in drawn.lanes if lane.open] == ["n1"]  # rank 5's, 8 a node
    html = render_html(model)
    assert len(html.encode()) < 2_000_000
    assert all(f'data-rank="{rank}"' in html for rank in (0, 499, 999))


@pytest.mark.parametrize(
    ("step", "fill"), [(0.1, "#2ca02c"), (0.05, "#2ca02c"), (0.15, "#e6c200"), (0.2, "#d62728"),
                       (0.9, "#d62728"), (None, "#c8ccd1")],
)  # fmt: skip
def test_the_heatmap_colours_step_time_against_the_median(step, fill):
    assert heat_fill(step, 0.1) == fill


@pytest.mark.parametrize(
    ("kind", "label"),
    [(MomentKind.HANG, "hang detected"), (MomentKind.INTERRUPT, "interrupted"),
     (MomentKind.ATTEMPT, "restart")],
)  # fmt: skip
def test_each_moment_of_the_whole_job_is_a_line_across_every_lane(run, kind, label):
    append_moments(run, [Moment(T0 + 9.0, kind, detail="why")])
    drawn = timeline(build_report(run.path))
    assert drawn is not None
    line = drawn.line(kind)
    assert line is not None and line.label == label and line.title.endswith(": why")
    html = render_html(build_report(run.path))
    lanes = html.count('class="lane')
    assert html.count(f'class="moment m-{kind}"') == 2 * lanes  # each lane's row and ranks


@pytest.mark.parametrize(
    ("kind", "detail", "title"),
    [(MomentKind.PROFILE, "profile: no rank stands apart", "profiled +12.0s: no rank stands apart"),
     (MomentKind.QUIET, "quiet, working: rank 3 computing",
      "quiet +12.0s: working: rank 3 computing"),
     (MomentKind.HANG, "no rank wrote anything", "hang detected +12.0s: no rank wrote anything")],
)  # fmt: skip
def test_a_moment_s_title_does_not_say_its_label_twice(run, kind, detail, title):
    append_moments(run, [Moment(T0 + 9.0, kind, detail=detail)])
    drawn = timeline(build_report(run.path))
    assert drawn is not None
    line = drawn.line(kind)
    assert line is not None and line.title == title


def test_a_hang_s_first_failure_is_when_it_was_seen_and_its_rank_is_at_fault(tmp_path):
    """A hung rank ends only when the teardown kills it: the first failure is when the head
    saw the hang, and the hung rank (a consequence of the teardown by its end) is at fault."""
    run = failed_job(tmp_path)
    doc = json.loads(run.job_file.read_text())
    for rank in doc["ranks"]:
        if rank["role"] == "cause":
            rank.update(role="consequence", exit_code=143, signal="SIGTERM", end=T0 + 14.5)
    doc["first_failure"]["kind"] = "hang"
    run.job_file.write_text(json.dumps(doc))
    model = build_report(run.path)
    drawn = timeline(model)
    assert drawn is not None and model.cause is not None
    failure = drawn.line("first-failure")
    assert failure is not None and "+15.2s" in failure.title  # the head saw it at T0 + 12.2
    at_fault = [(row.node, row.rank) for row in drawn.rows if row.at_fault]
    assert at_fault == [("n2", None), ("n2", 5)]
