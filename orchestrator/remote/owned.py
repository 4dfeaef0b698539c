"""Whether a path is the user's own to trust: not a link, of the kind expected, owned by the
user, writable by nobody else. One answer for the head (its job records, run/ownership.py)
and the nodes (the port reservations, remote/ports.py, shipped beside it as orch_owned).

A path someone else owns, or can write, may hold anything they like: a record that names
the interpreter orch runs on every node, a reservation that jams or hangs the chooser.
Pure, standard library only.
"""

from __future__ import annotations

import os
import stat
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
