"""The lock beside an environment that keeps `orch env push`'s swap and a job's start apart:
<root>.orch-lock, a file the push makes (its user's own, mode 0600). The node agent holds it
shared while the job it starts from that environment runs; a push takes it exclusively just
before it swaps the new environment in and, holding it, looks again for processes running
from the environment. So a job that starts meanwhile starts either before the swap (and the
push is refused) or after it (in the new environment), never with its environment swapped
and deleted under it. STANDARD LIBRARY ONLY, shipped beside remote/agent.py and
remote/envpush.py (as orch_env_lock).

Nobody but the environment's owner can open the file, so nobody else can hold it and keep a
push out or a job waiting; a file there that is not the owner's (another user's, a link, a
fifo) is never waited on by a job, and refused by a push.
"""

from __future__ import annotations

import fcntl
import os
import stat
import sys
import time
from collections.abc import Callable

LOCK_SUFFIX = ".orch-lock"
SHARED_WAIT_S = 30.0  # a push holds it only while it swaps: a job's start waits that long at most
_POLL_S = 0.05
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # never through a link, never on a fifo


def lock_path(root: str) -> str:
    """The lock file of the environment at `root` (its real path): beside it, never swapped."""
    return root.rstrip("/") + LOCK_SUFFIX


def own_environment() -> str:
    """The environment this interpreter runs from (a venv's or conda env's directory)."""
    return os.path.realpath(sys.prefix)


class NotALock(Exception):
    """The lock's path holds something the push cannot trust (not orch's: a link, a fifo,
    another user's file): the path and what it is."""


def take_exclusive(root: str) -> int | None:
    """The push's hold on the lock of `root`, made if missing: the open file, or None when a
    job holds it (it is starting or running from the environment). NotALock when the path
    is not a file of the user's own."""
    path = lock_path(root)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _OPEN, 0o600)
    except OSError as err:
        raise NotALock(f"{path} cannot be the environment's lock file: {err.strerror}") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise NotALock(f"{path} is not a file of your own (owner uid {info.st_uid})")
        os.fchmod(fd, 0o600)  # nobody else may open it: they could hold it
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold_shared(
    root: str, wait_s: float = SHARED_WAIT_S, waiting: Callable[[], object] = lambda: None
) -> int | None:
    """A job's hold on the lock of the environment at `root`, while it starts and runs (a
    push's swap waits for a job's start, and is refused while a job holds it): the open
    file, or None when there is none to hold: no push made it, it is not the environment
    owner's (another user's file is never waited on), or a push held it for all of
    `wait_s` (`waiting` is called meanwhile). Never raises: the lock protects the job, it
    never keeps it from starting."""
    try:
        fd = os.open(lock_path(root), os.O_RDONLY | _OPEN)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        owners = (os.stat(root).st_uid, os.getuid())
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in owners:
            raise OSError("not the environment owner's lock")
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                waiting()
                time.sleep(_POLL_S)
    except OSError:
        os.close(fd)
        return None
