"""Each node's sshd: found, started in the node's namespaces, waited for, stopped."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from orchestrator.errors import SandboxError
from orchestrator.sandbox.ports import port_open
from orchestrator.sandbox.processes import children, namespace_init, pid_alive, still_ours
from orchestrator.sandbox.render import hosts_file, node_dir, write_sshd_config
from orchestrator.sandbox.state import SandboxState

_SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
_START_TIMEOUT_S = 15.0


def find_sshd() -> str:
    override = os.environ.get("ORCH_SSHD")
    if override:
        if os.access(override, os.X_OK):
            return override
        raise SandboxError(
            f"ORCH_SSHD={override} is not an executable sshd",
            "point ORCH_SSHD at the OpenSSH server binary, or unset it",
        )
    found = shutil.which("sshd")
    if found:
        return found
    for candidate in _SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    raise SandboxError(
        "OpenSSH server (sshd) is not installed on this machine",
        "install it: `sudo apt-get install -y openssh-server openssh-client` "
        "(or run scripts/setup.sh, which installs everything orch needs)",
    )


def require_tool(tool: str, package: str) -> str:
    found = shutil.which(tool)
    if not found:
        raise SandboxError(
            f"`{tool}` is not installed on this machine",
            f"install it: `sudo apt-get install -y {package}`",
        )
    return found


def namespaces_available() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True,
        timeout=10,
        check=False,
    )
    return probe.returncode == 0


def _unshare_argv(directory: Path, name: str, shared_pids: bool) -> list[str]:
    """unshare into the node's own UTS and mount namespaces, and its own PID namespace
    unless the nodes share this machine's; sh then sets the node's hostname and
    /etc/hosts and becomes sshd (with its own PID namespace: the node's PID 1, whose
    death ends the node)."""
    own_pids = [] if shared_pids else ["--pid", "--fork", "--mount-proc"]
    script = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
    return [
        "unshare", "--uts", "--mount", *own_pids, "--propagation", "private",
        "--", "/bin/sh", "-c", script, "sh", name, str(hosts_file(directory)),
    ]  # fmt: skip


def start_node(directory: Path, sshd: str, name: str, address: str, port: int,
               sandbox_id: str, use_ns: bool, profile: str = "default",
               shared_pids: bool = False) -> int:  # fmt: skip
    """Start a node; its pid is the process that holds the node (unshare, or sshd)."""
    config = write_sshd_config(directory, name, address, port, sandbox_id, profile)
    sshd_cmd = [sshd, "-D", "-e", "-f", str(config)]
    argv = [*_unshare_argv(directory, name, shared_pids), *sshd_cmd] if use_ns else sshd_cmd
    log = (node_dir(directory, name) / "sshd.log").open("ab")
    with log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid


def wait_ready(state: SandboxState) -> None:
    directory = Path(state.directory)
    deadline = time.monotonic() + _START_TIMEOUT_S
    pending = list(state.nodes)
    while pending and time.monotonic() < deadline:
        pending = [n for n in pending if not port_open(n.address, n.port, 0.5)]
        for node in pending:
            if not pid_alive(node.pid):
                log = node_dir(directory, node.name) / "sshd.log"
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                raise SandboxError(
                    f"sshd for {node.name} ({node.address}:{node.port}) exited at start: "
                    + (" | ".join(tail) or "no output"),
                    f"see {log}",
                )
        if pending:
            time.sleep(0.1)
    if pending:
        raise SandboxError(
            "sandbox nodes did not start listening within "
            f"{_START_TIMEOUT_S:.0f}s: {', '.join(n.name for n in pending)}",
            f"see the sshd.log files under {directory}/nodes",
        )


def stop_node(holder_pid: int, directory: Path) -> None:
    """SIGKILL the node: its PID 1 (ending its PID namespace) and every descendant. A node
    already gone (a test killed it) is left alone: its pid may be another process's now."""
    if not still_ours(holder_pid, directory):
        return
    init = namespace_init(holder_pid)
    victims = [p for p in (init, holder_pid) if p is not None]
    # The node's processes without a PID namespace of its own are the sshd's descendants.
    pending = list(victims)
    while pending:
        pid = pending.pop()
        for child in children(pid):
            victims.append(child)
            pending.append(child)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in victims) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)
        time.sleep(0.05)
