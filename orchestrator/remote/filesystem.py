"""A node's filesystems as orch's node programs use them: the free space where a path is or
will be (the probe's disk check, env push's look, the checkpoint program's room checks) and
two paths exchanged in one step (env push's switch, a staged checkpoint put in place).
STANDARD LIBRARY ONLY, shipped beside the programs that use it (as orch_filesystem).
"""

from __future__ import annotations

import ctypes
import errno
import os

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def nearest_existing(path: str) -> str:
    """`path`, or its nearest ancestor that exists (a link followed: it is the filesystem it
    leads to that is asked about)."""
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def free_bytes(path: str) -> int:
    """Free space for the user on `path`'s filesystem (or its nearest existing ancestor's)."""
    stats = os.statvfs(nearest_existing(path))
    return stats.f_bavail * stats.f_frsize


def exchange(new: str, old: str) -> None:
    """`new` and `old` swapped in one step (renameat2 RENAME_EXCHANGE): a reader sees one or
    the other, never neither. OSError where the filesystem or the C library cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # a C library older than glibc 2.28, or none found
        raise OSError(errno.ENOSYS, f"cannot exchange {new} and {old}: renameat2 is not "
                                    "available") from None  # fmt: skip
    if renameat2(_AT_FDCWD, new.encode(), _AT_FDCWD, old.encode(), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot exchange {new} and {old}: {os.strerror(err)}")
