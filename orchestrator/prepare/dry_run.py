"""A dry run's look at the head: the facts plan/dry_checks.py judges (the script, the runs
directory), and the directory where the commands too long for a terminal are written so
they can be run as they are (`sh FILE`). Nothing of the job's record is written."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.plan.describe import CommandFile
from orchestrator.plan.dry_checks import HeadFacts, RunsDirFacts
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.records.ownership import record_problem
from orchestrator.remote import owned

DRY_RUNS_DIR = "dry-runs"  # in the user's own directory on the head, one folder per job


def head_facts(plan: LaunchPlan) -> HeadFacts:
    """The script and the runs directory as this machine sees them."""
    script = os.path.join(plan.workdir, plan.job.script)
    return HeadFacts(script_path=script, script_exists=os.path.isfile(script),
                     runs=runs_dir_facts(Path(plan.job.run_dir).parent))  # fmt: skip


def runs_dir_facts(root: Path) -> RunsDirFacts:
    """The runs directory, or the nearest folder above it where it would be made."""
    existing = root
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    writable = os.access(existing, os.W_OK | os.X_OK)
    if existing != root:
        return RunsDirFacts(str(root), str(existing), writable)
    problem = record_problem(root, os.lstat(root), os.getuid(), directory=True)
    return RunsDirFacts(str(root), str(root), writable,
                        not_own=problem.message if problem else None,
                        not_own_fix=problem.fix if problem else None)  # fmt: skip


def commands_dir(job_id: str) -> str:
    """Where a dry run writes the commands too long to print: <tmp>/orch-<uid>/dry-runs/<job>
    (named before it is made, so the plan's text can say it)."""
    user = owned.user_directory(os.getuid(), base=tempfile.gettempdir())
    return os.path.join(user, DRY_RUNS_DIR, job_id)


def write_command_files(directory: str, files: Sequence[CommandFile]) -> None:
    """Each command in its own file, in a directory only the user can read (made and
    checked as the job's private directory is: never through a link, never another's)."""
    if not files:
        return
    path = Path(directory)
    base = str(path.parent.parent)
    try:
        owned.make_user_directory(base, os.getuid(), way=owned.HEAD_WAY)
        owned.private_directories(base, [path.parent.name, path.name], os.getuid())
        for item in files:
            (path / item.name).write_text(item.text, encoding="utf-8")
        _prune(path.parent, keep=path.name)
    except (owned.UnsafeDirectory, OSError) as err:
        raise OrchError(f"the dry run's commands cannot be written in {directory}: {err}",
                        owned.HEAD_WAY) from err  # fmt: skip


KEPT_DRY_RUNS = 20  # the newest dry runs' command files kept; older ones are removed


def _prune(dry_runs: Path, keep: str) -> None:
    """Only the newest KEPT_DRY_RUNS dry runs' files stay (each about 60 KB), never `keep`.
    The folder is the user's own and checked: its entries are plain directories of files."""
    entries = sorted(
        (entry for entry in dry_runs.iterdir() if entry.name != keep and entry.is_dir()
         and not entry.is_symlink()),
        key=lambda entry: entry.stat().st_mtime,
    )  # fmt: skip
    for old in entries[: max(0, len(entries) - (KEPT_DRY_RUNS - 1))]:
        for child in old.iterdir():
            if child.is_file() and not child.is_symlink():
                child.unlink()
        with contextlib.suppress(OSError):
            old.rmdir()

