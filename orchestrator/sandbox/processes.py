"""What runs on a sandbox node, read from /proc."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from orchestrator.remote.procs import all_pids, environ_of
from orchestrator.sandbox.render import NODE_ENV, SANDBOX_ENV
from orchestrator.sandbox.state import SandboxState


def node_pids(state: SandboxState, name: str) -> list[int]:
    """Every process running on a node (its sshd included): its PID namespace's, or where
    the nodes share one, those whose sessions sshd marked with the node's name."""
    node = state.node(name)
    holder = still_ours(node.pid, state.directory)
    if state.own_pid_namespaces:
        init = namespace_init(node.pid) if holder else None
        if init is None:
            return []
        target = _pid_namespace(init)
        return [pid for pid in all_pids() if _pid_namespace(pid) == target]
    return [
        pid
        for pid in all_pids()
        if _environ(pid).get(NODE_ENV) == name
        and _environ(pid).get(SANDBOX_ENV) == state.sandbox_id
    ] + ([node.pid] if holder else [])


def _environ(pid: int) -> dict[str, str]:
    return environ_of(pid) or {}


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    return _stat_state(pid) not in (None, "Z")


def is_zombie(pid: int) -> bool:
    """Ended and not reaped yet: its pid is still its own."""
    return _stat_state(pid) == "Z"


def _stat_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def still_ours(pid: int, marker: str | os.PathLike[str]) -> bool:
    """Whether the process a saved pid named still runs, told by `marker` (the sandbox's
    directory) in its command line: once it has ended, the kernel may give its pid to any
    new process, another test's or another user's, which a signal must never reach."""
    if not pid_alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return os.fsencode(marker) in argv


def namespace_init(holder_pid: int) -> int | None:
    """The node's PID 1 (unshare's forked child) when the node has its own PID namespace,
    else the holder itself; None once the holder is gone."""
    if not pid_alive(holder_pid):
        return None
    own = _pid_namespace(holder_pid)
    for child in children(holder_pid):
        if _pid_namespace(child) != own:
            return child
    return holder_pid


def kill_processes_with_env(name: str, value: str) -> list[int]:
    me = os.getpid()
    killed = []
    for pid in all_pids():
        if pid != me and _environ(pid).get(name) == value:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed
