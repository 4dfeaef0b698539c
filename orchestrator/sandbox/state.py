"""What a sandbox is, once up: its nodes and files, kept in `<directory>/sandbox.json`."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.errors import SandboxError

STATE_FILE = "sandbox.json"


@dataclass(frozen=True)
class SandboxNode:
    name: str
    address: str
    port: int
    pid: int  # the process that holds the node: unshare, or sshd itself


@dataclass(frozen=True)
class SandboxState:
    directory: str
    sandbox_id: str
    prefix: str
    slots: int
    namespaces: bool
    user: str
    nodes: tuple[SandboxNode, ...]
    sshd_profile: str = "default"  # default | hardened (see render.SSHD_PROFILES)
    slurm_conf: str = ""  # with --slurm: the config clients need (SLURM_CONF)
    slurm_pids: tuple[int, ...] = ()  # munged, slurmctld, each node's slurmd (nsenter)
    shared_pids: bool = False  # the nodes share this machine's PID namespace
    guests: tuple[str, ...] = ()  # other accounts the nodes accept (sandbox/guests.py)

    @property
    def hostfile(self) -> str:
        return str(Path(self.directory) / "hostfile")

    @property
    def ssh_config(self) -> str:
        return str(Path(self.directory) / "ssh_config")

    @property
    def known_hosts(self) -> str:
        return str(Path(self.directory) / "known_hosts")

    @property
    def identity(self) -> str:
        return str(Path(self.directory) / "id_ed25519")

    @property
    def own_pid_namespaces(self) -> bool:
        """Each node has a PID namespace of its own (its processes are its namespace's)."""
        return self.namespaces and not self.shared_pids

    def node(self, name: str) -> SandboxNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise SandboxError(f"no sandbox node named {name!r}", "see `orch sandbox status`")


@dataclass(frozen=True)
class SandboxNodeStatus:
    name: str
    address: str
    port: int
    process_alive: bool
    port_open: bool


def default_directory() -> Path:
    env = os.environ.get("ORCH_SANDBOX_DIR")
    if env:
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "orch" / "sandbox"


def _directory_digest(directory: Path) -> str:
    return hashlib.sha256(str(directory).encode()).hexdigest()


def subnet_for(directory: Path) -> str:
    """A /24 inside 127.0.0.0/8 derived from the state directory, so sandboxes coexist."""
    digest = int(_directory_digest(directory), 16)
    return f"127.{100 + digest % 100}.{digest // 100 % 250 + 1}"


def sandbox_id_for(directory: Path) -> str:
    return _directory_digest(directory)[:12]


def load_state(directory: Path) -> SandboxState | None:
    state_file = directory / STATE_FILE
    try:
        raw = json.loads(state_file.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise SandboxError(
            f"{state_file}: unreadable sandbox state ({err})",
            f"remove {directory} after stopping its sshd processes",
        ) from err
    nodes = tuple(SandboxNode(**node) for node in raw.pop("nodes"))
    raw["slurm_pids"] = tuple(raw.get("slurm_pids", ()))
    raw["guests"] = tuple(raw.get("guests", ()))
    return SandboxState(nodes=nodes, **raw)


def save_state(state: SandboxState) -> None:
    state_file = Path(state.directory) / STATE_FILE
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    tmp.replace(state_file)
