"""The job's page in a real browser: Debian's headless Chromium renders the file, and the
rendered page holds every node and rank and the failure's cause, asks the network for
nothing, and makes a screenshot that is not blank."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from _chromium import CHROMIUM, chromium, png_pixels, recording_requests
from _report_job import EXCEPTION, STRAGGLER, failed_job

from orchestrator.report import write_report

WIDTH, HEIGHT = 1280, 2000

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
