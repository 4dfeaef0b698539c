"""Faults injected for real, for tests and benchmarks: a node frozen and thawed, a node
whose user's shell start-up file is its own, a node whose directory is its own (and small)."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import stat
import subprocess
from pathlib import Path

from orchestrator.errors import SandboxError
from orchestrator.sandbox.processes import namespace_init, node_pids, still_ours
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


def _mount_in_node(state: SandboxState, name: str, *mount_args: str) -> int:
    """Run `mount ARGS` in one node's mount namespace only; returns the pid of a process
    in it (the node's PID 1)."""
    if not state.namespaces:
        raise SandboxError("node-local files need the nodes' own mount namespaces",
                           "run the sandbox as root, with unshare available")  # fmt: skip
    pid = state.node(name).pid
    holder = namespace_init(pid) if still_ours(pid, state.directory) else None
    if holder is None:
        raise SandboxError(f"sandbox node {name} is not running", "run `orch sandbox up`")
    subprocess.run(["nsenter", "--target", str(holder), "--mount", "--", "mount", *mount_args],
                   check=True, capture_output=True, timeout=30)  # fmt: skip
    return holder


def _bind_in_node(state: SandboxState, name: str, source: Path, target: Path) -> None:
    """Bind-mount `source` over `target` in one node's mount namespace only."""
    _mount_in_node(state, name, "--bind", str(source), str(target))


def tmpfs_options(size_bytes: int, covered: os.stat_result) -> str:
    """mount(8) options of a tmpfs of `size_bytes` with the mode and owner of the directory
    it covers, so that the node's user may write there as before, up to that size."""
    if size_bytes <= 0:
        raise SandboxError(f"a node's directory of {size_bytes} bytes cannot hold anything",
                           "give a size in bytes above 0")  # fmt: skip
    mode = stat.S_IMODE(covered.st_mode)
    return f"size={size_bytes},mode={mode:o},uid={covered.st_uid},gid={covered.st_gid}"


def shell_startup(state: SandboxState, name: str, script: str) -> Path:
    """Give one node its own ~/.bashrc for the sandbox's user: `script` is written beside the
    node's files and bind-mounted over the user's ~/.bashrc in that node's mount namespace
    only, so the head and the other nodes keep theirs. bash runs it for every SSH command,
    as a real node's would. Undone when the node stops. Returns the file written."""
    # sshd starts the user's sessions in the passwd entry's home, whatever $HOME says here.
    home_rc = Path(pwd.getpwnam(state.user).pw_dir) / ".bashrc"
    if not home_rc.is_file():
        raise SandboxError(f"{home_rc} does not exist: there is nothing to stand in for",
                           f"create it (it may be empty): touch {home_rc}")  # fmt: skip
    rc = node_dir(Path(state.directory), name) / "bashrc"
    rc.write_text(script)
    _bind_in_node(state, name, rc, home_rc)
    return rc


def private_directory(state: SandboxState, name: str, path: Path,
                      size_bytes: int | None = None) -> Path:  # fmt: skip
    """Give one node its own, empty directory at `path` (which must exist here): a
    directory beside the node's files, bind-mounted over `path` in that node's mount
    namespace only. What the node writes there neither the head nor another node sees, as
    on a node's local disk. With `size_bytes` it is a filesystem of that size (a tmpfs),
    whose free space is what a full disk leaves. Undone when the node stops. Returns where
    this machine sees the node's directory."""
    if not path.is_dir():
        raise SandboxError(f"{path} is not a directory here", f"create it: mkdir -p {path}")
    if size_bytes is not None:
        options = tmpfs_options(size_bytes, path.stat())
        holder = _mount_in_node(state, name, "-t", "tmpfs", "-o", options, "tmpfs", str(path))
        return Path(f"/proc/{holder}/root") / path.relative_to(path.anchor)
    own = node_dir(Path(state.directory), name) / "private" / str(path).strip("/").replace("/", "%")
    own.mkdir(parents=True, exist_ok=True)
    _bind_in_node(state, name, own, path)
    return own
