"""The ports a sandbox's daemons listen on, each free on every address that needs it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from orchestrator.errors import SandboxError


def port_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def port_open(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


# One lock for every sandbox of this machine, whoever brings it up (flock needs no write
# access: any user may take it).
_CLAIM_LOCK = Path(tempfile.gettempdir()) / "orch-sandbox-ports.lock"


@contextlib.contextmanager
def ports_claimed() -> Iterator[None]:
    """Held from picking a sandbox's ports until its daemons listen on them: a port is
    picked because it is free, and two sandboxes brought up at once (two test workers, two
    users) would otherwise both find the same port free and start two daemons on it."""
    try:
        fd = os.open(_CLAIM_LOCK, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        yield  # an unusable temporary directory: bring the sandbox up as before
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def pick_ssh_port(addresses: Sequence[str]) -> int:
    """One port free on every node's address: 22 first when root may bind it."""
    preferred = [22, 2222, 2022, 22022] if os.geteuid() == 0 else [2222, 2022, 22022]
    for port in preferred:
        if all(port_free(addr, port) for addr in addresses):
            return port
    raise SandboxError(
        f"no free SSH port on {addresses[0]}..{addresses[-1]} (tried {preferred})",
        "stop whatever listens there, or use another --dir (which picks another subnet)",
    )


# Slurm's daemons (--slurm) bind every address: a block of ports free on all of them.
_SLURM_PORT_BASES = (6817, 16817, 26817, 36817, 46817)


def pick_slurm_ports(count: int) -> int:
    """The first of `count` consecutive free ports (controller, then one per slurmd)."""
    for base in _SLURM_PORT_BASES:
        if all(port_free("0.0.0.0", base + k) for k in range(count)):
            return base
    raise SandboxError(
        f"no {count} consecutive free ports for Slurm's daemons (tried from {_SLURM_PORT_BASES})",
        "stop whatever listens there (another Slurm?), or use fewer nodes",
    )
