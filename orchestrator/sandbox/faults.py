"""Faults injected for real, for tests and benchmarks: a node frozen and thawed, a node
whose user's shell start-up file is its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from orchestrator.errors import SandboxError
from orchestrator.sandbox.processes import namespace_init, node_pids
from orchestrator.sandbox.render import node_dir
from orchestrator.sandbox.state import SandboxState


def _signal_node(state: SandboxState, name: str, signum: signal.Signals) -> None:
    for pid in node_pids(state, name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def freeze(state: SandboxState, name: str) -> None:
    """SIGSTOP every process of a node: sockets stay open, nothing answers."""
    _signal_node(state, name, signal.SIGSTOP)


def thaw(state: SandboxState, name: str) -> None:
    _signal_node(state, name, signal.SIGCONT)


def shell_startup(state: SandboxState, name: str, script: str) -> Path:
    """Give one node its own ~/.bashrc for the sandbox's user: `script` is written beside the
    node's files and bind-mounted over the user's ~/.bashrc in that node's mount namespace
    only, so the head and the other nodes keep theirs. bash runs it for every SSH command,
    as a real node's would. Undone when the node stops. Returns the file written."""
    if not state.namespaces:
        raise SandboxError("a node's own ~/.bashrc needs the nodes' own mount namespaces",
                           "run the sandbox as root, with unshare available")  # fmt: skip
    home_rc = Path.home() / ".bashrc"
    if not home_rc.is_file():
        raise SandboxError(f"{home_rc} does not exist: there is nothing to stand in for",
                           f"create it (it may be empty): touch {home_rc}")  # fmt: skip
    holder = namespace_init(state.node(name).pid)
    if holder is None:
        raise SandboxError(f"sandbox node {name} is not running", "run `orch sandbox up`")
    rc = node_dir(Path(state.directory), name) / "bashrc"
    rc.write_text(script)
    subprocess.run(
        ["nsenter", "--target", str(holder), "--mount", "--", "mount", "--bind", str(rc),
         str(home_rc)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return rc
