"""On node 0: find a free main port for a job and reserve it until the launcher binds it.

Run inline by the head (no orch install on the node). Arguments:
    RESERVATIONS_DIR JOB_ID TTL_SECONDS PORT [PORT...]
RESERVATIONS_DIR `-` is this user's own directory on the node (`/tmp/orch-<uid>/ports`), `-`
followed by the user's ORCH_NODE_ROOT its ports/ there.
Prints one JSON line: {"port": N} or {"error": "..."}.

A port is taken when something listens on it, or when another job of this user reserved it
less than TTL seconds ago: two jobs started seconds apart would otherwise both find the port
free before either launcher had bound it. The reservation is a file created with O_EXCL, so
two jobs choosing at once never get the same port. TTL 0: look, reserve nothing (doctor).

Reservations are per user, in a directory only the user can write (checked, never trusted):
a shared directory let its first user lock everyone else out, and let anyone delete, fill or
jam the others' reservations. Across users, the bind test alone keeps jobs apart. Nothing in
the directory is trusted either: an entry is opened without following links and without
blocking (a FIFO would hang the chooser), only a regular file counts, and only its first
bytes are read.
Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import sys
import time

try:  # on a node, loaded beside this program
    import orch_owned as owned
except ImportError:
    from orchestrator.remote import owned

DEFAULT_DIR = "-"  # the argument for this user's own directory on the node (+ the setting)
PORTS_DIR = "ports"  # in the user's own directory
_READ_LIMIT = 256  # a reservation holds a job id; anything longer is not one of ours


UnsafeDirectory = owned.UnsafeDirectory


def default_reservations_dir(uid: int, root: str = "") -> str:
    return os.path.join(owned.user_directory(uid, root), PORTS_DIR)


def own_dir_argument(root: str = "") -> str:
    """RESERVATIONS_DIR for the user's own directory on the node (`root`: the setting)."""
    return DEFAULT_DIR + root


def reservations_dir(argument: str, uid: int) -> str:
    """The directory the argument names, made and checked; `-` (and the user's setting
    after it) is the user's own, whose parent is checked too (it is the user's directory,
    under the shared /tmp by default)."""
    if not argument.startswith(DEFAULT_DIR):
        owned.private_directory(argument, uid)
        return argument
    return owned.user_directories(uid, [PORTS_DIR], argument[len(DEFAULT_DIR):])


def port_is_free(port: int) -> bool:
    """Whether a listener could bind the port now, as torch's TCPStore does (any address,
    SO_REUSEADDR, IPv6 dual-stack where the node has IPv6)."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, address in families:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no such address family on this node
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError as err:
                if family == socket.AF_INET6 and err.errno == errno.EADDRNOTAVAIL:  # no IPv6
                    continue
                return False
    return True


def read_reservation(path: str) -> tuple[str, float] | None:
    """The job id a reservation names and its age in seconds; None when there is no regular
    file there (nothing, a link, a FIFO, a directory: none of them is a reservation)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        head = os.read(fd, _READ_LIMIT)
    except OSError:
        return None
    finally:
        os.close(fd)
    owner = head.partition(b"\n")[0].decode("utf-8", "replace").strip()
    return owner, time.time() - st.st_mtime


def _reservation_taken(path: str, ttl: float, job_id: str) -> bool:
    found = read_reservation(path)
    if found is None:
        return False
    owner, age = found
    return owner != job_id and age < ttl


def _reserve(path: str, ttl: float, job_id: str) -> bool:
    """Create the reservation, replacing one that expired (or whatever else is at its name,
    which is no reservation); False when another job won."""
    if _reservation_taken(path, ttl, job_id):
        return False
    with contextlib.suppress(OSError):
        os.unlink(path)  # expired, ours from a retry, or not a regular file
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(job_id + "\n")
    return True


def choose(directory: str, job_id: str, ttl: float, candidates: list[int]) -> dict:
    """The first free candidate, reserved in `directory` for `ttl` seconds (made and checked
    first: `-` for the user's own); a look only when ttl is 0."""
    if ttl > 0:
        directory = reservations_dir(directory, os.getuid())
    for port in candidates:
        path = os.path.join(directory, str(port))
        if ttl > 0 and _reservation_taken(path, ttl, job_id):
            continue
        if not port_is_free(port):
            continue
        if ttl <= 0 or _reserve(path, ttl, job_id):
            return {"port": port}
    first, last = min(candidates), max(candidates)
    if len(candidates) == 1:  # a port the user gave: say who holds it
        return {"error": f"port {first} is taken: {_holder(first)}"}
    return {"error": f"no free port among {len(candidates)} in {first}-{last}"}


def _holder(port: int) -> str:
    """Who listens on the port, from /proc/net/tcp (the listener's owner), where it shows.
    Imported here: the probe ships this module for its directories alone."""
    try:  # shipped inline: loaded beside this program as orch_<name>
        import orch_main_port as main_port  # type: ignore[import-not-found]
    except ImportError:
        from orchestrator.remote import main_port
    try:
        listeners = main_port.listeners_on(port)
    except OSError:
        listeners = []
    if not listeners:
        return "something binds it (no listener shows in /proc/net/tcp)"
    owners = sorted({main_port.user_shown(s.uid) for s in listeners})
    return f"a listener owned by {', '.join(owners)}"


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print("usage: ports RESERVATIONS_DIR JOB_ID TTL PORT [PORT...]", file=sys.stderr)
        return 2
    try:
        doc = choose(argv[0], argv[1], float(argv[2]), [int(p) for p in argv[3:]])
    except UnsafeDirectory as err:
        doc = {"error": str(err)}
    except OSError as err:
        doc = {"error": f"{err.strerror or err} ({err.filename or argv[0]})"}
    print(json.dumps(doc), flush=True)
    return 0 if "port" in doc else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
