"""A stop on the job's page, from a run directory written here with a job.json holding one:
the summary's sentence the very one the head printed (StopSummary.lines()), the moment the
stop was asked and its grace across the timeline, each rank's signal and end on its row with
a tooltip; folded past 64 ranks; a job without a stop, or an older job.json without `stop`,
drawn as before."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from html import unescape

import pytest
from _report_job import failed_job
from _report_stop import (
    ASKED,
    FAILED_RANK,
    GRACE,
    KILLED,
    NO_HANDLER,
    SENTENCE,
    TORN_DOWN,
    UNKNOWN,
    stop_summary,
    stopped_job,
)

from orchestrator.outcome.stop import StopEnding
from orchestrator.records.job import JOB_FILE
from orchestrator.report import build_report, render_html
from orchestrator.report.stop import LINES_SHOWN, SIGNALLED
from orchestrator.report.timeline import Scale, timeline


@pytest.fixture
def run(tmp_path):
    return stopped_job(tmp_path / "runs")


def _x(model, t: float) -> float:
    assert model.start is not None and model.end is not None
    return Scale(model.start, model.end).x(t)


def test_the_summary_is_the_sentence_the_head_printed(run):
    model = build_report(run.path)
    printed = run.load().stop.lines()  # what the CLI prints: `orch status`, the job's end
    assert model.stop_lines is not None
    assert model.stop_lines.sentence == printed[0] == SENTENCE
    assert model.stop_lines.details == tuple(line.strip() for line in printed[1:])
    assert "killed at the end of the 5 s grace: rank 5 on n2" in model.stop_lines.details
    assert model.stop_facts == ("SIGTERM to every rank +8.0s, 5 s grace (to +13.0s); torn down "
                                "+13.0s")  # fmt: skip


def test_the_html_says_the_stop_at_the_top(run):
    html = render_html(build_report(run.path))
    said = re.search(r'<p id="stop-line">([^<]*)</p>', html)
    assert said is not None and unescape(said.group(1)) == SENTENCE
    block = re.search(r'<div class="stop" id="stop"[^>]*>(.*?)</div>', html, re.S)
    assert block is not None
    items = [unescape(i) for i in re.findall(r"<li>([^<]*)</li>", block.group(1))]
    assert items == ["rank 1 on n1 exited with code 1",
                     "rank 3 on n1 was ended by SIGTERM itself: the script had no handler "
                     "for it then",
                     "killed at the end of the 5 s grace: rank 5 on n2",
                     "never reported an end: rank 6 on n2"]  # fmt: skip
    assert 'data-cause="ctrl-c" data-ending="grace-over"' in html


def test_the_timeline_marks_the_ask_and_shades_the_grace_to_its_end(run):
    model = build_report(run.path)
    drawn = timeline(model)
    assert drawn is not None and drawn.stop is not None
    assert drawn.stop.asked_x == _x(model, ASKED)
    assert drawn.stop.grace_end_x == _x(model, ASKED + GRACE)
    assert drawn.stop.grace_x + drawn.stop.grace_w == pytest.approx(_x(model, TORN_DOWN), abs=0.2)
    assert drawn.stop.label == "stop asked (Ctrl-C)"  # on the stop's own row, and its end:
    assert drawn.stop.grace_label == "grace ends +13.0s"
    assert drawn.stop.label_x > drawn.stop.asked_x
    assert drawn.stop.asked_title == ("stop asked by Ctrl-C +8.0s: SIGTERM to every rank, 5 s to "
                                      "save")  # fmt: skip
    # The recorded "ranks signalled" line gives way: each rank's row says when.
    assert drawn.line("stop") is None and drawn.line("teardown-start") is not None


def test_each_rank_s_row_marks_its_signal_and_how_it_ended(run):
    model = build_report(run.path)
    drawn = timeline(model)
    assert drawn is not None
    rows = {row.rank: row for row in drawn.rows if row.rank is not None}
    kinds = {rank: [mark.kind for mark in row.stop] for rank, row in rows.items()}
    assert kinds[0] == [SIGNALLED, "exited"]
    assert kinds[FAILED_RANK] == [SIGNALLED, "failed"]
    assert kinds[NO_HANDLER] == [SIGNALLED, "stop-signal"]
    assert kinds[KILLED] == [SIGNALLED, "killed"]
    assert kinds[UNKNOWN] == [SIGNALLED, "unknown"]
    signal, end = rows[KILLED].stop
    assert signal.x == _x(model, ASKED + 0.1 + 0.01 * KILLED)
    assert end.x == _x(model, TORN_DOWN + 0.2)
    assert end.title == ("rank 5 on n2: SIGTERM sent +8.1s; killed at the end of the 5 s grace "
                         "+13.2s, 5.1 s after its signal")  # fmt: skip
    assert rows[0].stop[1].title.endswith("exited by itself (exit code 0) +9.0s, 0.9 s after "
                                          "its signal")  # fmt: skip
    unknown = rows[UNKNOWN].stop[1]
    assert unknown.x == _x(model, TORN_DOWN)  # never heard of again: drawn at the teardown
    assert "never reported an end" in unknown.title
    # No node row carries marks of its own when its ranks are open.
    assert all(row.stop == () for row in drawn.rows if row.rank is None)


def test_the_html_draws_every_rank_s_marks_with_its_tooltip(run):
    html = render_html(build_report(run.path))
    for rank, kind in ((0, "exited"), (KILLED, "killed"), (NO_HANDLER, "stop-signal")):
        row = re.search(rf'<g class="rank[^"]*" data-node="n\d" data-rank="{rank}">(.*?)'
                        r"</g>\s*</g>", html, re.S)  # fmt: skip
        assert row is not None, rank
        assert re.findall(r'<g class="stop-mark" data-kind="([\w-]+)"', row.group(1)) == [
            SIGNALLED, kind]  # fmt: skip
    assert 'class="grace"' in html and 'class="stop-asked"' in html and 'class="grace-end"' in html
    assert "killed at the end of the 5 s grace +13.2s" in html
    assert 'id="stop-legend"' in html


def test_a_grace_longer_than_the_job_is_shaded_to_the_axis_end_only(tmp_path):
    run = stopped_job(tmp_path / "runs")
    stop = replace(run.load().stop, grace=300.0, ending=StopEnding.RANKS_EXITED)
    run.save(replace(run.load(), stop=stop))
    model = build_report(run.path)
    drawn = timeline(model)
    assert drawn is not None and drawn.stop is not None and model.end is not None
    assert model.end < ASKED + 60  # the axis is the job's, not the grace's
    assert drawn.stop.grace_end_x is None and drawn.stop.grace_label is None
    assert drawn.stop.grace_x + drawn.stop.grace_w == pytest.approx(_x(model, model.end), abs=0.2)
    assert "(the job had ended before it ran out)" in drawn.stop.grace_title
    assert 'class="grace-end"' not in render_html(model)


def test_a_node_the_signal_did_not_reach_says_why_on_its_row(tmp_path):
    run = stopped_job(tmp_path / "runs")
    why = "its agent did not answer"
    run.save(replace(run.load(), stop=replace(run.load().stop, unreached={"n2": why})))
    drawn = timeline(build_report(run.path))
    assert drawn is not None
    [n2] = [row for row in drawn.rows if row.rank is None and row.node == "n2"]
    assert [(m.kind, m.title) for m in n2.stop] == [
        ("unreached", f"n2: the stop signal was not sent: {why}")]  # fmt: skip


def test_1000_ranks_fold_the_stop_into_each_node_s_row(tmp_path):
    run = stopped_job(tmp_path / "runs", nodes=125, per_node=8)
    model = build_report(run.path)
    assert model.folded
    drawn = timeline(model)
    assert drawn is not None
    heads = [row for row in drawn.rows if row.rank is None and row.css == "node"]
    assert len(heads) == 125
    n1 = heads[0]
    assert [(m.kind, m.count) for m in n1.stop] == [
        (SIGNALLED, 8), ("exited", 4), ("failed", 1), ("stop-signal", 1), ("killed", 1),
        ("unknown", 1)]  # fmt: skip
    assert n1.stop[0].title == "n1: SIGTERM sent to 8 of 8 ranks +8.1s to +8.2s"
    assert n1.stop[1].title == ("n1: 4 of 8 ranks exited by themselves (exit code 0), the "
                                "last +11.8s: ranks 0,2,4,7")  # fmt: skip
    assert n1.stop[4].title == ("rank 5 on n1: SIGTERM sent +8.1s; killed at the end of the 5 s "
                                "grace +13.2s, 5.1 s after its signal")  # fmt: skip
    strips = [row for row in drawn.rows if row.css == "strip"]
    assert [c.stop_end for c in strips[0].cells] == [
        "exited", "failed", "exited", "stop-signal", "exited", "killed", "unknown", "exited"]
    html = render_html(model)
    assert len(html) < 2_000_000
    assert html.count('class="stop-mark"') == 125 * 6  # a few per node, not one per rank
    assert len(re.findall(r'data-stop-end="', html)) == 1000
    lines = build_report(run.path).stop_lines
    assert lines is not None and len(lines.details) == LINES_SHOWN
    assert lines.more == len(run.load().stop.lines()) - 1 - LINES_SHOWN
    assert f"and {lines.more} more" in html


def test_a_job_without_a_stop_shows_nothing_new(tmp_path):
    html = render_html(build_report(failed_job(tmp_path / "runs").path))
    for new in ('id="stop"', 'class="stop-mark"', 'class="grace"', 'id="stop-facts"',
                'data-stop-end', 'id="stop-legend"', 'class="stop-asked"'):  # fmt: skip
        assert new not in html, new


def test_an_old_job_json_without_stop_renders_as_before(tmp_path):
    run = failed_job(tmp_path / "runs")
    before = render_html(build_report(run.path))
    path = run.path / JOB_FILE
    doc = json.loads(path.read_text())
    doc.pop("stop", None)
    path.write_text(json.dumps(doc))
    assert build_report(run.path).stop is None
    assert render_html(build_report(run.path)) == before


def test_the_stop_of_the_fixture_is_what_the_head_records():
    """The test's record reads back whole through job.json's own reader."""
    stop = stop_summary()
    assert type(stop).from_json(json.loads(json.dumps(stop.to_json()))) == stop
