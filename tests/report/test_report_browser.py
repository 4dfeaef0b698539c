"""The job's page in a real browser: Debian's headless Chromium renders the file, and the
rendered page holds every node and rank and the failure's cause, asks the network for
nothing, and makes a screenshot that is not blank; the job's checkpoints are drawn where
they became complete; a stop's signal and each rank's end are drawn on its row."""

from __future__ import annotations

import re
from dataclasses import replace
from html import unescape
from pathlib import Path

import pytest
from _chromium import CHROMIUM, chromium, colour_at, png_pixels, png_rows, recording_requests
from _report_checkpoints import NEWEST, checkpoints_record, with_checkpoints
from _report_job import EXCEPTION, STRAGGLER, failed_job
from _report_stop import FAILED_RANK, KILLED, NO_HANDLER, SENTENCE, UNKNOWN, stopped_job

from orchestrator.report import build_report, write_report
from orchestrator.report.timeline import LABEL_W, timeline

WIDTH, HEIGHT = 1280, 2000
COMPLETE_GREEN, BEING_WRITTEN_ORANGE = "#2b8a3e", "#e69500"  # the page's style sheet
SIGNAL_PURPLE, KILLED_RED = "#4b1d7a", "#d62728"

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh)"),
]


def test_chromium_renders_every_rank_and_the_cause(tmp_path):
    run = failed_job(tmp_path / "runs")
    run.save(replace(run.load(), hang_watch={
        "seconds": 120.0, "source": "floor",
        "quiet_work": ["rank 0 computing in evaluate (train.py:88); 7 ranks in barrier"],
    }))  # fmt: skip
    page = write_report(run.path).as_uri()
    dom = chromium(tmp_path / "profile", "--dump-dom", page).stdout
    ranks = {int(rank) for rank in re.findall(r'data-rank="(\d+)"', dom)}
    assert ranks == set(range(8))
    assert {node for node in re.findall(r'data-node="([^"]+)"', dom)} == {"n1", "n2"}
    cause = re.search(r'<section id="cause"[^>]*>(.*?)</section>', dom, re.S)
    assert cause is not None and EXCEPTION in cause.group(1)
    assert "rank 5 on n2" in cause.group(1)
    slowest = re.search(r'<p id="slowest"[^>]*>([^<]*)</p>', dom)
    assert slowest is not None and slowest.group(1).startswith(f"slowest: rank {STRAGGLER} on n1")
    watch = re.search(r'<dd id="hang-watch">([^<]*)</dd>', dom)
    assert watch is not None and watch.group(1) == (
        "looked for after 120 s quiet (floor); quiet, but working: rank 0 computing in "
        "evaluate (train.py:88); 7 ranks in barrier"
    )

    shot = tmp_path / "shot.png"
    chromium(tmp_path / "profile", f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}", page)
    width, height, pixels = png_pixels(shot)
    assert (width, height) == (WIDTH, HEIGHT)
    assert shot.stat().st_size > 50_000  # a blank page of this size compresses to a few KB
    assert len(set(pixels)) > 100  # text, bars and colours, not one background


def _requests_of(tmp_path: Path, page: Path) -> tuple[list[str], str]:
    with recording_requests() as proxy:
        dom = chromium(tmp_path / "profile", *proxy.flags, "--virtual-time-budget=3000",
                       "--dump-dom", page.as_uri()).stdout  # fmt: skip
        proxy.settle()  # the browser has ended: its requests are all sent
        return proxy.page_requests, dom


def test_nothing_leaves_the_file_and_the_check_would_see_a_cdn_link(tmp_path):
    run = failed_job(tmp_path / "runs")
    page = write_report(run.path)
    requests, dom = _requests_of(tmp_path, page)
    assert requests == []
    assert 'id="timeline"' in dom and 'id="progress"' in dom  # the page did load, whole

    # The same page with what a template could let in: a CDN style sheet, a web font,
    # an image and a script. Each reaches the recording proxy: the check above can fail.
    planted = page.with_name("planted.html")
    planted.write_text(page.read_text().replace("</head>", (
        '<link rel="stylesheet" href="https://cdn.example/chart.css">'
        '<style>@font-face { font-family: X; src: url(http://fonts.example/x.woff2); }'
        ' body { font-family: X; }</style>'
        '<script src="http://cdn.example/chart.js"></script></head>'
    )).replace("</body>", '<img src="http://img.example/logo.png"></body>'))  # fmt: skip
    requests, _dom = _requests_of(tmp_path, planted)
    hosts = {host for line in requests for host in re.findall(r"[a-z]+\.example", line)}
    assert {"cdn.example", "img.example"} <= hosts, requests


def test_1000_ranks_render_every_rank(tmp_path):
    run = failed_job(tmp_path / "runs", nodes=125, per_node=8)
    page = write_report(run.path)
    assert page.stat().st_size < 2_000_000
    dom = chromium(tmp_path / "profile", "--dump-dom", page.as_uri()).stdout
    assert {int(rank) for rank in re.findall(r'data-rank="(\d+)"', dom)} == set(range(1000))
    assert {n for n in re.findall(r'data-node="([^"]+)"', dom)} == {f"n{i}" for i in range(1, 126)}


def _clusters(xs: list[int]) -> list[float]:
    """The centres of runs of neighbouring x positions: one per shape drawn on a row."""
    runs: list[list[int]] = []
    for x in sorted(set(xs)):
        if runs and x - runs[-1][-1] <= 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return [(run[0] + run[-1]) / 2 for run in runs]


def test_chromium_shows_each_checkpoint_where_it_became_complete(tmp_path):
    """The checkpoints' lane as Chromium draws it: every mark in the DOM with its tooltip,
    the restart's sentence in the section, and on the screenshot the two complete
    checkpoints' green diamonds side by side on one row, as far apart as their times."""
    run = with_checkpoints(failed_job(tmp_path / "runs"), checkpoints_record())
    page = write_report(run.path).as_uri()
    dom = chromium(tmp_path / "profile", "--dump-dom", page).stdout
    lane = re.search(r'<svg class="checkpoints".*?</svg>', dom, re.S)
    assert lane is not None
    assert re.findall(r'data-kind="(\w+)"', lane.group(0)) == [
        "deleted", "complete", "complete", "incomplete", "restore"]  # fmt: skip
    titles = [unescape(t) for t in re.findall(r"<title>([^<]*)</title>", lane.group(0))]
    assert any(t.startswith(f"{NEWEST}/: 128.0 MiB; complete +") and "copies on n[1-2]" in t
               for t in titles)  # fmt: skip
    section = re.search(r'<section id="checkpoints">(.*?)</section>', dom, re.S)
    assert section is not None
    assert checkpoints_record().restores[0].sentence in unescape(section.group(1))

    shot = tmp_path / "shot.png"
    chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,900", page)
    _width, _height, rows = png_rows(shot, upto=900)
    green = colour_at(rows, COMPLETE_GREEN)
    assert green, "no complete checkpoint drawn"
    top = min(y for _x, y in green)  # the lane's diamonds come before the legend's swatch
    middle = top + 4  # a diamond of half-height 5: its widest row
    centres = _clusters([x for x, y in green if y == middle])
    assert len(centres) == 2, centres
    drawn = timeline(build_report(run.path))
    assert drawn is not None
    xs = {mark.label: mark.x for mark in drawn.checkpoints}
    assert abs((centres[1] - centres[0]) - (xs[NEWEST] - xs["global_step5"])) <= 2
    # The checkpoint still being written: a hollow orange diamond on the same row, after.
    orange = [x for x, y in colour_at(rows[top - 2 : top + 12], BEING_WRITTEN_ORANGE)]
    assert orange and min(orange) > centres[1]


def _blobs(points: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Points that touch (8-neighbours), grouped: one group per shape drawn."""
    left = set(points)
    groups = []
    while left:
        todo = [left.pop()]
        group = []
        while todo:
            x, y = todo.pop()
            group.append((x, y))
            for near in ((x + dx, y + dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1)):
                if near in left:
                    left.remove(near)
                    todo.append(near)
        groups.append(group)
    return sorted(groups, key=lambda g: min(y for _x, y in g))


def test_chromium_draws_the_stop_on_every_rank_s_row(tmp_path):
    """A job stopped by Ctrl-C as Chromium draws it: the head's sentence at the top, each
    rank's row with its signal and its end and their tooltip in the DOM; on the screenshot
    one signal mark per rank's row, and the killed rank's cross as far after its signal as
    their times."""
    run = stopped_job(tmp_path / "runs")
    page = write_report(run.path).as_uri()
    dom = chromium(tmp_path / "profile", "--dump-dom", page).stdout
    said = re.search(r'<p id="stop-line">([^<]*)</p>', dom)
    assert said is not None and unescape(said.group(1)) == SENTENCE
    facts = re.search(r'<dd id="stop-facts">([^<]*)</dd>', dom)
    assert facts is not None and facts.group(1).startswith("SIGTERM to every rank +8.0s")
    ends = {}
    for rank in range(8):
        row = re.search(rf'<g class="rank[^"]*" data-node="n\d" data-rank="{rank}">(.*?)'
                        r"</g>\s*</g>", dom, re.S)  # fmt: skip
        assert row is not None, rank
        kinds = re.findall(r'<g class="stop-mark" data-kind="([\w-]+)"', row.group(1))
        assert kinds[0] == "signalled", rank
        ends[rank] = kinds[1]
    assert ends == {0: "exited", FAILED_RANK: "failed", 2: "exited", NO_HANDLER: "stop-signal",
                    4: "exited", KILLED: "killed", UNKNOWN: "unknown", 7: "exited"}  # fmt: skip
    assert "rank 5 on n2: SIGTERM sent +8.1s; killed at the end of the 5 s grace +13.2s" in dom
    lane = re.search(r'<svg class="stop-lane".*?</svg>', dom, re.S)
    assert lane is not None
    assert re.findall(r'<text class="stop-label"[^>]*><title>[^<]*</title>([^<]*)</text>',
                      lane.group(0)) == ["stop asked (Ctrl-C)", "grace ends +13.0s"]  # fmt: skip

    shot = tmp_path / "shot.png"
    chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,1000", page)
    _width, _height, rows = png_rows(shot, upto=1000)
    # The legend's swatches stand left of where the plot begins (LABEL_W into its SVG,
    # itself inside the page's margin); the marks are inside it.
    signals = _blobs([(x, y) for x, y in colour_at(rows, SIGNAL_PURPLE) if x > LABEL_W])
    assert len(signals) == 8, [(min(g), max(g), len(g)) for g in signals]  # one per rank's row
    top, bottom = min(y for g in signals for _x, y in g), max(y for g in signals for _x, y in g)
    killed = _blobs([(x, y) for x, y in colour_at(rows, KILLED_RED) if top <= y <= bottom])
    assert len(killed) == 1
    cross_x = sum(x for x, _y in killed[0]) / len(killed[0])
    cross_y = sum(y for _x, y in killed[0]) / len(killed[0])
    row5 = next(g for g in signals if min(y for _x, y in g) <= cross_y <= max(y for _x, y in g))
    drawn = timeline(build_report(run.path))
    assert drawn is not None
    signal, end = next(row.stop for row in drawn.rows if row.rank == KILLED)
    assert abs((cross_x - min(x for x, _y in row5)) - (end.x - signal.x)) <= 3
