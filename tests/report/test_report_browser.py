"""The job's page in a real browser: Debian's headless Chromium renders the file, and the
rendered page holds every rank and the failure's cause, on a screenshot that is not blank."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from _report_job import EXCEPTION, failed_job

from orchestrator.report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Nothing a test needs: no network, no first-run work, no profile of the user's.
QUIET = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip
WIDTH, HEIGHT = 1280, 2000

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh)"),
]


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [CHROMIUM or "chromium", *QUIET, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)


def _png_pixels(path: Path) -> tuple[int, int, bytes]:
    """A PNG's width, height and its decompressed scanlines."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, offset = b"", 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        if data[offset + 4 : offset + 8] == b"IDAT":
            idat += data[offset + 8 : offset + 8 + length]
        offset += 12 + length
    return width, height, zlib.decompress(idat)


def test_chromium_renders_every_rank_and_the_cause(tmp_path):
    run = failed_job(tmp_path / "runs")
    page = write_report(run.path).as_uri()
    dom = _chromium(tmp_path, "--dump-dom", page).stdout
    ranks = {int(rank) for rank in re.findall(r'data-rank="(\d+)"', dom)}
    assert ranks == set(range(8))
    assert {node for node in re.findall(r'data-node="([^"]+)"', dom)} == {"n1", "n2"}
    cause = re.search(r'<section id="cause"[^>]*>(.*?)</section>', dom, re.S)
    assert cause is not None and EXCEPTION in cause.group(1)
    assert "rank 5 on n2" in cause.group(1)

    shot = tmp_path / "shot.png"
    _chromium(tmp_path, f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}", page)
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (WIDTH, HEIGHT)
    assert shot.stat().st_size > 50_000  # a blank page of this size compresses to a few KB
    assert len(set(pixels)) > 100  # text, bars and colours, not one background
