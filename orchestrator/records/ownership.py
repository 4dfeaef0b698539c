"""Job records are trusted only when they are the user's own.

`orch kill` and `orch stacks` run the interpreter a record's `job.json` names on every host
it lists; `orch status` and `orch logs` show what the record says. A runs directory someone
else owns, or can write (a `./runs` under `/tmp`, a group-writable one), could hold a record
written by anyone: it is refused, with the path, its owner, its mode and the fix, before
any record in it is read.

`record_problem` decides on values (lstat's answer and a uid); `check_runs_root` and
`check_job` look at the paths.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.records.job import RunDir
from orchestrator.remote.owned import NotOwn, not_own

ELSEWHERE = (
    "orch trusts only records of your own: use a runs directory that is yours "
    "(--runs-dir DIR or ORCH_RUNS_DIR), or have its owner remove it"
)


def record_problem(path: Path, st: os.stat_result, uid: int, *, directory: bool) -> NotOwn | None:
    """Why a runs directory, job directory (`directory`) or job.json, as lstat saw it, is no
    record of `uid`'s; None when it is."""
    return not_own(str(path), st, uid, directory=directory, elsewhere=ELSEWHERE)


def check_path(path: Path, *, directory: bool, uid: int | None = None) -> None:
    """Raise OrchError naming what is wrong with `path`; a missing path is left to the
    caller, which says there is no such job."""
    try:
        st = os.lstat(path)  # a link is refused, not followed
    except FileNotFoundError:
        return
    problem = record_problem(path, st, os.getuid() if uid is None else uid, directory=directory)
    if problem is not None:
        raise OrchError(problem.message, problem.fix)


def check_runs_root(root: Path) -> None:
    """The runs directory (`runs_root` has resolved it: the directory links lead to)."""
    check_path(root, directory=True)


def check_job(run: RunDir) -> None:
    """A job's directory and its job.json, before the record is acted on."""
    check_path(run.path, directory=True)
    check_path(run.job_file, directory=False)
