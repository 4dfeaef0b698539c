"""On node 0: find a free main port for a job and reserve it until the launcher binds it.

Run inline by the head (no orch install on the node). Arguments:
    RESERVATIONS_DIR JOB_ID TTL_SECONDS PORT [PORT...]
Prints one JSON line: {"port": N} or {"error": "..."}.

A port is taken when something listens on it, or when another job reserved it less than
TTL seconds ago: two jobs started seconds apart would otherwise both find the port free
before either launcher had bound it. The reservation is a file created with O_EXCL, so
two jobs choosing at once never get the same port. TTL 0: look, reserve nothing (doctor).
Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time


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


def _reservation_taken(path: str, ttl: float, job_id: str) -> bool:
    try:
        with open(path, encoding="utf-8") as handle:
            owner = handle.read().strip()
        age = time.time() - os.stat(path).st_mtime
    except OSError:
        return False
    return owner != job_id and age < ttl


def _reserve(path: str, ttl: float, job_id: str) -> bool:
    """Create the reservation, replacing one that expired; False when another job won."""
    if _reservation_taken(path, ttl, job_id):
        return False
    with contextlib.suppress(OSError):
        os.unlink(path)  # expired (or ours from a retry)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(job_id + "\n")
    return True


def _reservations_dir(path: str) -> None:
    if not os.path.isdir(path):
        with contextlib.suppress(FileExistsError):
            os.makedirs(path)
        with contextlib.suppress(OSError):
            os.chmod(path, 0o1777)  # shared by every user's jobs, like /tmp


def choose(directory: str, job_id: str, ttl: float, candidates: list[int]) -> dict:
    if ttl > 0:
        _reservations_dir(directory)
    for port in candidates:
        path = os.path.join(directory, str(port))
        if ttl > 0 and _reservation_taken(path, ttl, job_id):
            continue
        if not port_is_free(port):
            continue
        if ttl <= 0 or _reserve(path, ttl, job_id):
            return {"port": port}
    first, last = min(candidates), max(candidates)
    return {"error": f"no free port among {len(candidates)} in {first}-{last}"}


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print("usage: ports RESERVATIONS_DIR JOB_ID TTL PORT [PORT...]", file=sys.stderr)
        return 2
    try:
        doc = choose(argv[0], argv[1], float(argv[2]), [int(p) for p in argv[3:]])
    except OSError as err:
        doc = {"error": f"{err.strerror or err} ({argv[0]})"}
    print(json.dumps(doc), flush=True)
    return 0 if "port" in doc else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
