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


def _bind_in_node(state: SandboxState, name: str, source: Path, target: Path) -> None:
    """Bind-mount `source` over `target` in one node's mount namespace only."""
    if not state.namespaces:
        raise SandboxError("node-local files need the nodes' own mount namespaces",
                           "run the sandbox as root, with unshare available")  # fmt: skip
    holder = namespace_init(state.node(name).pid)
    if holder is None:
        raise SandboxError(f"sandbox node {name} is not running", "run `orch sandbox up`")
    subprocess.run(
        ["nsenter", "--target", str(holder), "--mount", "--", "mount", "--bind", str(source),
         str(target)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip


def shell_startup(state: SandboxState, name: str, script: str) -> Path:
    """Give one node its own ~/.bashrc for the sandbox's user: `script` is written beside the
    node's files and bind-mounted over the user's ~/.bashrc in that node's mount namespace
    only, so the head and the other nodes keep theirs. bash runs it for every SSH command,
    as a real node's would. Undone when the node stops. Returns the file written."""
    home_rc = Path.home() / ".bashrc"
    if not home_rc.is_file():
        raise SandboxError(f"{home_rc} does not exist: there is nothing to stand in for",
                           f"create it (it may be empty): touch {home_rc}")  # fmt: skip
    rc = node_dir(Path(state.directory), name) / "bashrc"
    rc.write_text(script)
    _bind_in_node(state, name, rc, home_rc)
    return rc


def private_directory(state: SandboxState, name: str, path: Path) -> Path:
    """Give one node its own, empty directory at `path` (which must exist here): a
    directory beside the node's files, bind-mounted over `path` in that node's mount
    namespace only. What the node writes there neither the head nor another node sees, as
    on a node's local disk. Undone when the node stops. Returns the node's directory."""
    if not path.is_dir():
        raise SandboxError(f"{path} is not a directory here", f"create it: mkdir -p {path}")
    own = node_dir(Path(state.directory), name) / "private" / str(path).strip("/").replace("/", "%")
    own.mkdir(parents=True, exist_ok=True)
    _bind_in_node(state, name, own, path)
    return own
