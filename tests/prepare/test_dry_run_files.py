"""The files a dry run writes for commands too long to print: private to the user, and only
the newest dry runs' kept."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.plan.describe import CommandFile
from orchestrator.prepare import dry_run
from orchestrator.prepare.dry_run import KEPT_DRY_RUNS, write_command_files


@pytest.fixture
def tmp_base(tmp_path, monkeypatch):
    monkeypatch.setattr(dry_run.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path


def test_a_dry_runs_commands_are_private_and_only_the_newest_are_kept(tmp_base):
    written = []
    for number in range(KEPT_DRY_RUNS + 5):
        directory = dry_run.commands_dir(f"job{number:02d}")
        write_command_files(directory, [CommandFile("head.sh", f"echo {number}\n")])
        os.utime(directory, (1_000_000 + number, 1_000_000 + number))
        written.append(Path(directory))
    kept = sorted(p.name for p in written[0].parent.iterdir())
    assert kept == [f"job{n:02d}" for n in range(5, KEPT_DRY_RUNS + 5)]
    newest = written[-1]
    assert (newest / "head.sh").read_text() == f"echo {KEPT_DRY_RUNS + 4}\n"
    assert stat.S_IMODE(newest.stat().st_mode) == 0o700
