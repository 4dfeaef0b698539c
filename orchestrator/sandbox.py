"""`orch sandbox`: a cluster of real OpenSSH nodes on this machine's loopback addresses.

Node K is the system sshd listening on its own 127.a.b.K address. Where the
machine allows it (root and unshare), each node runs in its own UTS, mount and
PID namespace: `hostname` prints the node's name, /etc/hosts names every node,
and killing the namespace's first process ends everything that ran on the node.
Every session also carries ORCH_SANDBOX_ID (sshd's SetEnv), so `down` finds what
a node started even without namespaces.

The sandbox owns everything under its state directory: per-node host keys, one
client key, a known_hosts that trusts exactly its nodes, an ssh_config, a
DeepSpeed hostfile. The only thing it adds outside is a marked `Include` block
at the top of ~/.ssh/config, removed again by `down`.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from orchestrator import sandbox_slurm
from orchestrator.errors import SandboxError
from orchestrator.run.slurm import node_states

DEFAULT_PREFIX = "node"
SANDBOX_ENV = "ORCH_SANDBOX_ID"
_SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
_START_TIMEOUT_S = 15.0


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
    sshd_profile: str = "default"  # default | hardened (see SSHD_PROFILES)
    slurm_conf: str = ""  # with --slurm: the config clients need (SLURM_CONF)
    slurm_pids: tuple[int, ...] = ()  # munged, slurmctld, each node's slurmd (nsenter)

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


def subnet_for(directory: Path) -> str:
    """A /24 inside 127.0.0.0/8 derived from the state directory, so sandboxes coexist."""
    digest = int(hashlib.sha256(str(directory).encode()).hexdigest(), 16)
    return f"127.{100 + digest % 100}.{digest // 100 % 250 + 1}"


def _find_sshd() -> str:
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


def _require(tool: str, package: str) -> str:
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


def _port_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def _port_open(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def _pick_port(addresses: list[str]) -> int:
    preferred = [22, 2222, 2022, 22022] if os.geteuid() == 0 else [2222, 2022, 22022]
    for port in preferred:
        if all(_port_free(addr, port) for addr in addresses):
            return port
    raise SandboxError(
        f"no free SSH port on {addresses[0]}..{addresses[-1]} (tried {preferred})",
        "stop whatever listens there, or use another --dir (which picks another subnet)",
    )


# Slurm's daemons (--slurm) bind every address: a block of ports free on all of them.
_SLURM_PORT_BASES = (6817, 16817, 26817, 36817, 46817)


def _pick_slurm_ports(count: int) -> int:
    """The first of `count` consecutive free ports (controller, then one per slurmd)."""
    for base in _SLURM_PORT_BASES:
        if all(_port_free("0.0.0.0", base + k) for k in range(count)):
            return base
    raise SandboxError(
        f"no {count} consecutive free ports for Slurm's daemons (tried from {_SLURM_PORT_BASES})",
        "stop whatever listens there (another Slurm?), or use fewer nodes",
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _keygen(path: Path, comment: str) -> str:
    for suffix in ("", ".pub"):
        with contextlib.suppress(FileNotFoundError):
            Path(f"{path}{suffix}").unlink()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return Path(f"{path}.pub").read_text().strip()


# sshd settings that differ between the kinds of node the sandbox can stand in for.
SSHD_PROFILES: dict[str, tuple[str, ...]] = {
    # Benchmarks open many sessions at once; OpenSSH's 10:30:100 drops them.
    "default": ("MaxStartups 512:30:1024", "MaxSessions 256", "Subsystem sftp internal-sftp"),
    # A hardened cluster: no SFTP subsystem, OpenSSH's default session limits, no
    # forwarding of any kind.
    "hardened": (
        "MaxStartups 10:30:100",
        "MaxSessions 10",
        "AllowTcpForwarding no",
        "AllowAgentForwarding no",
        "X11Forwarding no",
    ),
}


class Sandbox:
    """One loopback cluster, identified by its state directory."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = (directory or default_directory()).expanduser().resolve()
        self.state_file = self.directory / "sandbox.json"

    # ----- state -------------------------------------------------------------
    def load(self) -> SandboxState | None:
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise SandboxError(
                f"{self.state_file}: unreadable sandbox state ({err})",
                f"remove {self.directory} after stopping its sshd processes",
            ) from err
        nodes = tuple(SandboxNode(**node) for node in raw.pop("nodes"))
        raw["slurm_pids"] = tuple(raw.get("slurm_pids", ()))
        return SandboxState(nodes=nodes, **raw)

    def _save(self, state: SandboxState) -> None:
        data = asdict(state)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(self.state_file)

    # ----- up ----------------------------------------------------------------
    def up(self, nodes: int = 4, slots: int = 2, prefix: str = DEFAULT_PREFIX,
           sshd_profile: str = "default", slurm: bool = False) -> SandboxState:  # fmt: skip
        if sshd_profile not in SSHD_PROFILES:
            raise SandboxError(
                f"no sshd profile {sshd_profile!r}", f"choose one of: {', '.join(SSHD_PROFILES)}"
            )
        if not 1 <= nodes <= 250:
            raise SandboxError(f"--nodes must be between 1 and 250, got {nodes}")
        if slots < 1:
            raise SandboxError(f"--slots must be at least 1, got {slots}")
        current = self.load()
        if current is not None:
            wanted = (nodes, slots, prefix, sshd_profile, slurm)
            have = (len(current.nodes), current.slots, current.prefix, current.sshd_profile,
                    bool(current.slurm_conf))  # fmt: skip
            if have == wanted and all(
                s.process_alive and s.port_open for s in self.status(current)
            ):
                return current
            self.down()
        sshd = _find_sshd()
        _require("ssh-keygen", "openssh-client")
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        use_ns = namespaces_available()
        if slurm:
            sandbox_slurm.require_tools()
            if not use_ns:
                raise SandboxError(
                    "a Slurm sandbox needs each node in its own namespaces (root and unshare), "
                    "so that every slurmd answers under its node's hostname",
                    "run `orch sandbox up --slurm` as root on a machine where unshare works",
                )
        subnet = subnet_for(self.directory)
        addresses = [f"{subnet}.{k}" for k in range(1, nodes + 1)]
        port = _pick_port(addresses)
        sandbox_id = hashlib.sha256(str(self.directory).encode()).hexdigest()[:12]
        names = [f"{prefix}{k}" for k in range(1, nodes + 1)]
        user = getpass.getuser()
        self._write_keys_and_files(names, addresses, port, user, slots)
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        started: list[SandboxNode] = []
        try:
            for name, address in zip(names, addresses, strict=True):
                pid = self._start_node(sshd, name, address, port, sandbox_id, use_ns, sshd_profile)
                started.append(SandboxNode(name=name, address=address, port=port, pid=pid))
            state = SandboxState(
                directory=str(self.directory),
                sandbox_id=sandbox_id,
                prefix=prefix,
                slots=slots,
                namespaces=use_ns,
                user=user,
                nodes=tuple(started),
                sshd_profile=sshd_profile,
            )
            self._save(state)
            self._wait_ready(state)
            if slurm:
                state = self._start_slurm(state)
                self._save(state)
            _install_include(self.directory)
        except BaseException:
            for node in started:
                _kill_node_process(node.pid)
            raise
        return state

    def _start_slurm(self, state: SandboxState) -> SandboxState:
        base = _pick_slurm_ports(len(state.nodes) + 1)
        nodes = [
            sandbox_slurm.SlurmNode(n.name, n.address, base + 1 + k)
            for k, n in enumerate(state.nodes)
        ]
        inits = [_namespace_init(n.pid) or n.pid for n in state.nodes]
        daemons = sandbox_slurm.start(self.directory, nodes, inits, cpus=state.slots)
        return replace(state, slurm_conf=daemons.conf, slurm_pids=daemons.pids)

    def _write_keys_and_files(
        self, names: list[str], addresses: list[str], port: int, user: str, slots: int
    ) -> None:
        d = self.directory
        client_pub = _keygen(d / "id_ed25519", f"orch-sandbox-client@{d}")
        (d / "authorized_keys").write_text(client_pub + "\n")
        known: list[str] = []
        for name, address in zip(names, addresses, strict=True):
            node_dir = d / "nodes" / name
            node_dir.mkdir(parents=True, exist_ok=True)
            host_pub = _keygen(node_dir / "ssh_host_ed25519_key", f"orch-sandbox-{name}")
            keytype, key = host_pub.split()[:2]
            hosts = [name, address] if port == 22 else [f"[{name}]:{port}", f"[{address}]:{port}"]
            known.append(f"{','.join(hosts)} {keytype} {key}")
        (d / "known_hosts").write_text("\n".join(known) + "\n")
        blocks = [f"# orch sandbox {d}: written by `orch sandbox up`, removed by `down`"]
        for name, address in zip(names, addresses, strict=True):
            blocks.append(
                "\n".join(
                    [
                        f"Host {name}",
                        f"    HostName {address}",
                        f"    Port {port}",
                        f"    User {user}",
                        f"    IdentityFile {d / 'id_ed25519'}",
                        "    IdentitiesOnly yes",
                        f"    UserKnownHostsFile {d / 'known_hosts'}",
                        "    StrictHostKeyChecking yes",
                        "    CheckHostIP no",
                        "    BatchMode yes",
                        "    ConnectTimeout 10",
                        "    LogLevel ERROR",
                    ]
                )
            )
        (d / "ssh_config").write_text("\n\n".join(blocks) + "\n")
        (d / "hostfile").write_text("".join(f"{name} slots={slots}\n" for name in names))
        try:
            base_hosts = Path("/etc/hosts").read_text()
        except OSError:
            base_hosts = "127.0.0.1 localhost\n"
        extra = "".join(
            f"{address} {name}\n" for name, address in zip(names, addresses, strict=True)
        )
        (d / "hosts").write_text(base_hosts.rstrip("\n") + "\n# orch sandbox nodes\n" + extra)

    def _sshd_config(
        self, name: str, address: str, port: int, sandbox_id: str, profile: str
    ) -> Path:
        d = self.directory
        node_dir = d / "nodes" / name
        config = node_dir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {address}:{port}",
                    f"HostKey {node_dir / 'ssh_host_ed25519_key'}",
                    "PidFile none",
                    f"AuthorizedKeysFile {d / 'authorized_keys'}",
                    "StrictModes no",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",
                    f"AllowUsers {getpass.getuser()}",
                    "PrintMotd no",
                    "PrintLastLog no",
                    "UseDNS no",
                    *SSHD_PROFILES[profile],
                    f"SetEnv {SANDBOX_ENV}={sandbox_id} ORCH_SANDBOX_NODE={name}",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        return config

    def _start_node(
        self, sshd: str, name: str, address: str, port: int, sandbox_id: str, use_ns: bool,
        profile: str = "default",
    ) -> int:  # fmt: skip
        config = self._sshd_config(name, address, port, sandbox_id, profile)
        node_dir = self.directory / "nodes" / name
        sshd_cmd = [sshd, "-D", "-e", "-f", str(config)]
        if use_ns:
            # sh sets the node's hostname and /etc/hosts inside the new namespaces,
            # then becomes sshd: PID 1 of the node, whose death ends the node.
            script = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
            argv = [
                "unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc",
                "--propagation", "private", "--", "/bin/sh", "-c", script, "sh",
                name, str(self.directory / "hosts"), *sshd_cmd,
            ]  # fmt: skip
        else:
            argv = sshd_cmd
        log = (node_dir / "sshd.log").open("ab")
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

    def _wait_ready(self, state: SandboxState) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        pending = list(state.nodes)
        while pending and time.monotonic() < deadline:
            pending = [n for n in pending if not _port_open(n.address, n.port, 0.5)]
            for node in pending:
                if not _pid_alive(node.pid):
                    log = self.directory / "nodes" / node.name / "sshd.log"
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
                f"see the sshd.log files under {self.directory}/nodes",
            )

    # ----- status --------------------------------------------------------------
    def status(self, state: SandboxState | None = None) -> list[SandboxNodeStatus]:
        state = state or self.load()
        if state is None:
            return []
        return [
            SandboxNodeStatus(
                name=n.name,
                address=n.address,
                port=n.port,
                process_alive=_pid_alive(n.pid),
                port_open=_port_open(n.address, n.port, 0.5),
            )
            for n in state.nodes
        ]

    def slurm_states(self, state: SandboxState) -> dict[str, str]:
        """Each node's state in Slurm (sinfo), with --slurm; {} without, or no answer."""
        if not state.slurm_conf:
            return {}
        return node_states(sandbox_slurm.slurm_environment(state.slurm_conf))

    # ----- down ----------------------------------------------------------------
    def down(self) -> SandboxState | None:
        state = self.load()
        _remove_include(self.directory)
        if state is None:
            return None
        sandbox_slurm.stop(state.slurm_pids)
        for node in state.nodes:
            _kill_node_process(node.pid)
        shutil.rmtree(sandbox_slurm.slurm_dir(self.directory), ignore_errors=True)
        # Whatever a session started and moved out of the node's reach (or every
        # session, without namespaces) still carries the sandbox id in its environment.
        kill_processes_with_env(SANDBOX_ENV, state.sandbox_id)
        for leftover in ("sandbox.json", "known_hosts", "ssh_config", "hostfile", "hosts"):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / leftover).unlink()
        shutil.rmtree(self.directory / "nodes", ignore_errors=True)
        for key in ("id_ed25519", "id_ed25519.pub", "authorized_keys"):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / key).unlink()
        return state

    # ----- faults, for tests and benchmarks ------------------------------------
    def node_pids(self, name: str) -> list[int]:
        """Every process running on a node (its sshd included)."""
        state = self._require_state()
        node = state.node(name)
        if state.namespaces:
            init = _namespace_init(node.pid)
            if init is None:
                return []
            target = _pid_namespace(init)
            return [pid for pid in _all_pids() if _pid_namespace(pid) == target]
        return [
            pid
            for pid in _all_pids()
            if _environ(pid).get("ORCH_SANDBOX_NODE") == name
            and _environ(pid).get(SANDBOX_ENV) == state.sandbox_id
        ] + [node.pid]

    def freeze(self, name: str) -> None:
        """SIGSTOP every process of a node: sockets stay open, nothing answers."""
        for pid in self.node_pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        for pid in self.node_pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def _require_state(self) -> SandboxState:
        state = self.load()
        if state is None:
            raise SandboxError("no sandbox is up", "run `orch sandbox up`")
        return state


# ----- process helpers ---------------------------------------------------------
def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _namespace_init(holder_pid: int) -> int | None:
    """The node's PID 1: unshare's forked child, when the node runs in namespaces."""
    if not _pid_alive(holder_pid):
        return None
    own = _pid_namespace(holder_pid)
    for child in _children(holder_pid):
        if _pid_namespace(child) != own:
            return child
    return holder_pid


def _kill_node_process(holder_pid: int) -> None:
    init = _namespace_init(holder_pid)
    victims = [p for p in (init, holder_pid) if p is not None]
    # The node's processes without namespaces are the sshd's descendants.
    pending = list(victims)
    while pending:
        pid = pending.pop()
        for child in _children(pid):
            victims.append(child)
            pending.append(child)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(_pid_alive(p) for p in victims) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)
        time.sleep(0.05)


def kill_processes_with_env(name: str, value: str) -> list[int]:
    me = os.getpid()
    killed = []
    for pid in _all_pids():
        if pid != me and _environ(pid).get(name) == value:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


# ----- ~/.ssh/config management ------------------------------------------------
def _markers(directory: Path) -> tuple[str, str]:
    return (f"# >>> orch sandbox {directory} >>>", f"# <<< orch sandbox {directory} <<<")


@contextlib.contextmanager
def _ssh_config_locked() -> Iterator[Path]:
    ssh_dir = Path.home() / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    with (ssh_dir / ".orch-sandbox.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield ssh_dir / "config"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _strip_block(text: str, directory: Path) -> str:
    begin, end = _markers(directory)
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == begin:
            inside = True
        elif line.rstrip("\n") == end and inside:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def _install_include(directory: Path) -> None:
    begin, end = _markers(directory)
    with _ssh_config_locked() as config:
        text = config.read_text() if config.exists() else ""
        text = _strip_block(text, directory)
        # Include must come before any Host block to apply to every host.
        block = f"{begin}\nInclude {directory / 'ssh_config'}\n{end}\n"
        _write_private(config, block + text)


def _remove_include(directory: Path) -> None:
    with _ssh_config_locked() as config:
        if not config.exists():
            return
        text = config.read_text()
        stripped = _strip_block(text, directory)
        if stripped != text:
            _write_private(config, stripped)


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".orch-tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    tmp.replace(path)
