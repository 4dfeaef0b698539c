"""Job records are trusted only when they are the user's own.

`orch kill` and `orch stacks` run the interpreter a record's `job.json` names on every host
it lists; `orch status` and `orch logs` show what the record says; `orch launch` writes the
job's command, environment and output into it. A runs directory someone else owns, or can
write (a `./runs` under `/tmp`, a group-writable one, one another user made first), could
hold a record written by anyone, or have names swapped under orch: it is refused, with the
path, its owner, its mode and the fix, before any record in it is read or written.

`record_problem` decides on values (what stat says and a uid); `open_own` opens a path
without following a link and checks what it opened, so what is then read or written is what
was checked (records/rundir.py holds such descriptors); `check_runs_root` and `check_job`
look at the paths.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Protocol

from orchestrator.errors import (
    OrchError,
)
from orchestrator.remote.owned import NotOwn, not_own

ELSEWHERE = (
    "orch trusts only records of your own: use a runs directory that is yours "
    "(--runs-dir DIR or ORCH_RUNS_DIR), or have its owner remove it"
)
# A directory opened to be held: never through a link, never handed to a child process.
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A record read: never through a link, and a FIFO planted in its place does not block.
_RECORD_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def record_problem(path: Path, st: os.stat_result, uid: int, *, directory: bool) -> NotOwn | None:
    """Why a runs directory, job directory (`directory`) or job.json, as lstat saw it, is no
    record of `uid`'s; None when it is."""
    return not_own(str(path), st, uid, directory=directory, elsewhere=ELSEWHERE)


def refuse(path: Path, st: os.stat_result, *, directory: bool) -> None:
    """Raise OrchError naming what is wrong with `path` (as stat saw it) for this user."""
    problem = record_problem(path, st, os.getuid(), directory=directory)
    if problem is not None:
        raise OrchError(problem.message, problem.fix)


def open_own(shown: Path, name: str | Path, *, directory: bool, dir_fd: int | None = None) -> int:
    """A descriptor of `name` (relative to `dir_fd`, or a path), opened without following a
    link and checked: a directory, or a record to read, of the user's own that nobody else
    can write. `shown`: the path errors name. OrchError when it is not; FileNotFoundError
    passes, for the caller to say there is no such job."""
    try:
        fd = os.open(name, DIRECTORY_FLAGS if directory else _RECORD_FLAGS, dir_fd=dir_fd)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        refuse(shown, os.stat(name, dir_fd=dir_fd, follow_symlinks=False), directory=directory)
        raise  # it changed between the two looks: the open's own error
    try:
        refuse(shown, os.fstat(fd), directory=directory)
    except OrchError:
        os.close(fd)
        raise
    return fd


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
    """The runs directory (`runs_root` names it; itself never a link); missing passes."""
    try:
        os.close(open_own(root, root, directory=True))
    except FileNotFoundError:
        return


class JobDirectory(Protocol):
    """A job's directory as records/rundir.py's RunDir opens it (it imports this module)."""

    def check(self) -> None: ...


def check_job(run: JobDirectory) -> None:
    """A job's directory and its job.json, before the record is acted on."""
    run.check()
