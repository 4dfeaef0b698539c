"""Whether a path is the user's own to trust: not a link, of the kind expected, owned by the
user, writable by nobody else. One answer for the head (its job records, records/ownership.py;
the job's private directory) and the nodes (the user's directory /tmp/orch-<uid> with the
job's node directories and the port reservations, shipped beside them as orch_owned), and
the one way orch makes such a directory: under umask 077, then checked.

A path someone else owns, or can write, may hold anything they like: a record that names
the interpreter orch runs on every node, a reservation that jams or hangs the chooser.
Pure, standard library only.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NotOwn:
    """What is wrong with a path (it, its owner and mode named) and the fix."""

    message: str
    fix: str

    @property
    def line(self) -> str:
        return f"{self.message}: {self.fix}"


def owner_name(uid: int) -> str:
    """`alice (uid 1000)`, or `uid 1000` where no account has that uid."""
    try:
        import pwd  # not on every platform

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def not_own(path: str, st: os.stat_result, uid: int, *, directory: bool,
            elsewhere: str) -> NotOwn | None:  # fmt: skip
    """Why `path`, as lstat saw it, is not `uid`'s own directory (or regular file); None when
    it is. `elsewhere`: the fix when it is not the user's at all (a link, another kind,
    another owner); writable by others is fixed by chmod."""
    mode, owner = st.st_mode, st.st_uid
    said = f"{path} (owner {owner_name(owner)}, mode {stat.S_IMODE(mode):04o})"
    kind = "directory" if directory else "regular file"
    if stat.S_ISLNK(mode):
        return NotOwn(f"{said} is a symbolic link, not a {kind} of your own", elsewhere)
    if not (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
        return NotOwn(f"{said} is not a {kind}", elsewhere)
    if owner != uid:
        return NotOwn(f"{said} belongs to another user, not to {owner_name(uid)}", elsewhere)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return NotOwn(f"{said} is writable by others", f"chmod go-w -- {path}, and run again")
    return None


# ----- the user's own directory, made and checked ------------------------------------
class UnsafeDirectory(Exception):
    """A directory orch would use is not the user's own: one line with the path, its owner,
    its mode and the fix (`problem`, the two apart)."""

    def __init__(self, problem: NotOwn) -> None:
        super().__init__(problem.line)
        self.problem = problem


def user_directory(uid: int | str, base: str = "/tmp") -> str:
    """The user's own directory for orch under `base` (a node's /tmp, the head's temporary
    directory): everything orch keeps per job lives below it. Not $XDG_RUNTIME_DIR: it is
    removed when the user's last session ends, which for the one-command sessions orch
    opens on a node is right after each one."""
    return os.path.join(base, f"orch-{uid}")


def not_own_directory(path: str, st: os.stat_result, uid: int) -> NotOwn | None:
    """Why `path` (as lstat saw it) is no directory of `uid`'s own for orch to use, with its
    owner, its mode and the fix; None when it is."""
    fix = f"remove it (rm -rf -- {path}, as its owner or root) and run again"
    return not_own(path, st, uid, directory=True, elsewhere=fix)


def directory_problem(path: str, st: os.stat_result, uid: int) -> str | None:
    """not_own_directory's answer in one line."""
    problem = not_own_directory(path, st, uid)
    return problem.line if problem else None


def private_directory(path: str, uid: int) -> None:
    """Make `path` (its parent must exist) readable and writable by the user alone, then
    check what is there with lstat: one made by someone else first (a link, another
    user's, one others can write) is refused, never used."""
    old = os.umask(0o077)  # set before mkdir: never open to others, not even for a second
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    finally:
        os.umask(old)
    problem = not_own_directory(path, os.lstat(path), uid)
    if problem is not None:
        raise UnsafeDirectory(problem)


def private_directories(top: str, below: Sequence[str], uid: int) -> str:
    """`top`, then each of `below` in it in turn, each made and checked as
    `private_directory` does; the deepest. A link anywhere on the way is refused, so
    nothing below `top` is ever reached through one."""
    path = top
    private_directory(path, uid)
    for part in below:
        path = os.path.join(path, part)
        private_directory(path, uid)
    return path


def write_private_file(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write a file only the user can read (`mode`), replacing a regular file there but
    never following a link to somewhere else."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)  # a file that was there keeps its mode otherwise
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
