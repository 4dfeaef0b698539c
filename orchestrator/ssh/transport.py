"""SSH to the nodes: the only module that uses paramiko.

It honours what a user's OpenSSH client would: ~/.ssh/config (with Include,
which paramiko's SSHConfig does not process), known_hosts with OpenSSH's rules
(hashed entries, `[host]:port`, patterns, @revoked), the agent, IdentityFile
and the default keys, ProxyJump and ProxyCommand. It is stricter in two ways:
authentication is by key only (a server that wants a password fails at once,
nothing ever prompts), and a host key is never accepted silently.

Every failure is an `SSHFailure` with a kind (resolve, refused, timeout, auth,
hostkey-unknown, hostkey-changed, command, other), a message naming the node,
and a hint that says how to fix it. Operations over many nodes return one
outcome per node, and each node's work is bounded by its timeout.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import glob
import hashlib
import hmac
import os
import re
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import paramiko

from orchestrator.errors import OrchError
from orchestrator.pernode import GroupResult, NodeResult, failed, for_each_node, succeeded

DEFAULT_USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
_MAX_INCLUDE_DEPTH = 16
_POLL_S = 0.02

FAILURE_KINDS = (
    "resolve",
    "refused",
    "timeout",
    "auth",
    "hostkey-unknown",
    "hostkey-changed",
    "command",
    "other",
)


# ----- results and errors --------------------------------------------------------
@dataclass(frozen=True)
class SSHFailure:
    node: str
    kind: str
    message: str
    hint: str


class SSHError(OrchError):
    def __init__(self, failure: SSHFailure) -> None:
        super().__init__(failure.message, failure.hint)
        self.failure = failure


@dataclass(frozen=True)
class CommandResult:
    node: str
    exit_code: int
    stdout: bytes
    stderr: bytes


def _fail(node: str, kind: str, message: str, hint: str) -> SSHError:
    return SSHError(SSHFailure(node=node, kind=kind, message=message, hint=hint))


# ----- ssh_config ----------------------------------------------------------------
def _include_paths(argument: str, base_dir: Path) -> list[Path]:
    paths: list[Path] = []
    for word in shlex.split(argument):
        pattern = os.path.expanduser(word)
        if not os.path.isabs(pattern):
            # OpenSSH: relative user-config includes are relative to ~/.ssh.
            pattern = str(base_dir / pattern)
        paths.extend(Path(p) for p in sorted(glob.glob(pattern)))
    return paths


def expand_includes(text: str, base_dir: Path, depth: int = 0) -> str:
    """Inline every `Include` (globs, ~, relative to ~/.ssh), recursively."""
    if depth > _MAX_INCLUDE_DEPTH:
        raise OrchError(
            "ssh config: Include nested too deeply (a loop?)",
            "check the Include lines of ~/.ssh/config",
        )
    out: list[str] = []
    for line in text.splitlines():
        match = re.match(r"\s*include(?:\s*=\s*|\s+)(.+)$", line, re.IGNORECASE)
        if not match:
            out.append(line)
            continue
        for path in _include_paths(match.group(1).strip(), base_dir):
            try:
                included = path.read_text()
            except OSError:
                continue  # OpenSSH ignores includes it cannot read
            out.append(expand_includes(included, base_dir, depth + 1))
    return "\n".join(out) + "\n"


def _read_config(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
    except OSError as err:
        raise OrchError(f"{path}: cannot read ({err})", "fix its permissions") from err


def load_ssh_config(
    path: str | os.PathLike[str] = DEFAULT_USER_CONFIG,
    system_path: str | os.PathLike[str] | None = SYSTEM_CONFIG,
) -> paramiko.SSHConfig:
    """The user's ssh_config, then the system one (first value wins, as in OpenSSH)."""
    config_path = Path(os.path.expanduser(str(path)))
    text = expand_includes(_read_config(config_path), Path(os.path.expanduser("~/.ssh")))
    if system_path is not None:
        system = Path(system_path)
        # `Host *` closes the user's last Host block, so the system file's
        # global lines apply to every host and not only to that block.
        text += "\nHost *\n" + expand_includes(_read_config(system), system.parent)
    try:
        return paramiko.SSHConfig.from_text(text)
    except Exception as err:
        raise OrchError(
            f"{config_path}: ssh config does not parse ({err})", "fix the line it names"
        ) from err


@dataclass(frozen=True)
class SSHTarget:
    """Everything needed to reach one node, as ssh_config resolves it."""

    node: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    use_agent: bool
    known_hosts_files: tuple[str, ...]
    host_key_alias: str | None
    strict: str  # "yes" | "accept-new"
    connect_timeout: float | None
    proxy_jump: tuple[str, ...]
    proxy_command: str | None

    @property
    def host_key_name(self) -> str:
        """The name known_hosts is searched for, as OpenSSH does."""
        host = self.host_key_alias or self.hostname
        return host if self.port == 22 else f"[{host}]:{self.port}"


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


def resolve_target(
    node: str, config: paramiko.SSHConfig | None = None, *, accept_new: bool = False
) -> SSHTarget:
    """Apply ssh_config to a node name (an alias, a host name or an address)."""
    host, user_override, port_override = _split_destination(node)
    options = (config or load_ssh_config()).lookup(host)
    known = []
    for entry in _as_list(options.get("userknownhostsfile")):
        known.extend(shlex.split(entry))
    if not known:
        known = list(DEFAULT_KNOWN_HOSTS)
    for entry in _as_list(options.get("globalknownhostsfile")) or list(GLOBAL_KNOWN_HOSTS):
        known.extend(shlex.split(entry))
    strict = str(options.get("stricthostkeychecking", "ask")).lower()
    # `no`/`off`/`ask` are all treated as `yes`: orch never accepts a key silently
    # and never prompts. `accept-new` (or the CLI flag) records unknown keys.
    mode = "accept-new" if accept_new or strict == "accept-new" else "yes"
    jump = str(options.get("proxyjump", "none"))
    proxy_command = options.get("proxycommand")
    timeout = options.get("connecttimeout")
    agent_opt = str(options.get("identityagent", "")).lower()
    return SSHTarget(
        node=node,
        hostname=str(options.get("hostname", host)),
        port=int(port_override or options.get("port", 22)),
        user=user_override or str(options.get("user", getpass.getuser())),
        identity_files=tuple(os.path.expanduser(p) for p in _as_list(options.get("identityfile"))),
        identities_only=str(options.get("identitiesonly", "no")).lower() == "yes",
        use_agent=agent_opt != "none",
        known_hosts_files=tuple(os.path.expanduser(p) for p in known if p.lower() != "none"),
        host_key_alias=options.get("hostkeyalias"),
        strict=mode,
        connect_timeout=float(timeout) if timeout else None,
        proxy_jump=tuple(j for j in jump.split(",") if j and j.lower() != "none"),
        proxy_command=None
        if proxy_command is None or str(proxy_command).lower() == "none"
        else str(proxy_command),
    )


def _split_destination(dest: str) -> tuple[str, str | None, int | None]:
    """`user@host:port` (as in ProxyJump) -> parts; a plain name stays as it is."""
    user = None
    if "@" in dest:
        user, dest = dest.rsplit("@", 1)
    port = None
    match = re.fullmatch(r"\[(.+)\]:(\d+)|([^:]+):(\d+)", dest)
    if match:
        dest = match.group(1) or match.group(3)
        port = int(match.group(2) or match.group(4))
    return dest, user, port


# ----- known_hosts, with OpenSSH's matching rules --------------------------------
@dataclass(frozen=True)
class KnownHostEntry:
    marker: str | None  # None, "@revoked" or "@cert-authority"
    patterns: tuple[str, ...]
    keytype: str
    key_base64: str
    source: str
    line: int


def parse_known_hosts(text: str, source: str = "<known_hosts>") -> list[KnownHostEntry]:
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        marker = None
        if fields[0].startswith("@"):
            marker, fields = fields[0], fields[1:]
        if len(fields) < 3:
            continue
        entries.append(
            KnownHostEntry(
                marker, tuple(fields[0].split(",")), fields[1], fields[2], source, number
            )
        )
    return entries


def _hashed_match(pattern: str, name: str) -> bool:
    # |1|base64(salt)|base64(HMAC-SHA1(salt, name))
    try:
        _, _, salt_b64, digest_b64 = pattern.split("|")
        salt, digest = base64.b64decode(salt_b64), base64.b64decode(digest_b64)
    except ValueError:
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)


def _wildcard_match(pattern: str, name: str) -> bool:
    # OpenSSH patterns know only `*` and `?`; `[` is literal (as in `[host]:port`).
    regex = "".join(
        ".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower()
    )
    return re.fullmatch(regex, name.lower()) is not None


def host_matches(patterns: Sequence[str], name: str) -> bool:
    """OpenSSH host list: any positive match and no negated match."""
    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        match = _hashed_match if body.startswith("|1|") else _wildcard_match
        hit = match(body, name)
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def _keytype_family(keytype: str) -> str:
    # Server signature algorithms for one RSA key differ in name from its key type.
    return "ssh-rsa" if keytype in ("ssh-rsa", "rsa-sha2-256", "rsa-sha2-512") else keytype


@dataclass(frozen=True)
class HostKeyVerdict:
    status: str  # "known" | "unknown" | "changed" | "revoked" | "other-type"
    entry: KnownHostEntry | None = None
    known_types: tuple[str, ...] = ()


def check_host_key(
    entries: Sequence[KnownHostEntry], name: str, keytype: str, key_base64: str
) -> HostKeyVerdict:
    """Decide as OpenSSH does whether a server key is trusted for `name`."""
    family = _keytype_family(keytype)
    same_type: list[KnownHostEntry] = []
    other_types: set[str] = set()
    for entry in entries:
        if entry.marker == "@cert-authority" or not host_matches(entry.patterns, name):
            continue
        if entry.marker == "@revoked":
            if entry.key_base64 == key_base64:
                return HostKeyVerdict("revoked", entry)
            continue
        if _keytype_family(entry.keytype) == family:
            if entry.key_base64 == key_base64:
                return HostKeyVerdict("known", entry)
            same_type.append(entry)
        else:
            other_types.add(entry.keytype)
    if same_type:
        return HostKeyVerdict("changed", same_type[0], tuple(sorted(other_types)))
    if other_types:
        return HostKeyVerdict("other-type", None, tuple(sorted(other_types)))
    return HostKeyVerdict("unknown")


def load_known_hosts(files: Sequence[str]) -> list[KnownHostEntry]:
    entries: list[KnownHostEntry] = []
    for path in files:
        with contextlib.suppress(OSError):
            entries.extend(parse_known_hosts(Path(path).read_text(), path))
    return entries


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


_known_hosts_lock = threading.Lock()


def _record_host_key(path: str, name: str, key: paramiko.PKey) -> None:
    Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _known_hosts_lock, open(path, "a") as handle:
        handle.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def _preferred_host_key_types(entries: Sequence[KnownHostEntry], name: str) -> list[str]:
    types: list[str] = []
    for entry in entries:
        if entry.marker is None and host_matches(entry.patterns, name):
            if _keytype_family(entry.keytype) == "ssh-rsa":
                types += ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]
            else:
                types.append(entry.keytype)
    return list(dict.fromkeys(types))


def _verify_host_key(target: SSHTarget, key: paramiko.PKey) -> None:
    name = target.host_key_name
    entries = load_known_hosts(target.known_hosts_files)
    verdict = check_host_key(entries, name, key.get_name(), key.get_base64())
    fp = f"{key.get_name()} {fingerprint(key)}"
    node = target.node
    if verdict.status == "known":
        return
    if verdict.status == "revoked":
        raise _fail(
            node,
            "hostkey-changed",
            f"{node}: host key {fp} is marked @revoked in {verdict.entry.source}",
            "the key was revoked on purpose; ask the machine's administrator",
        )
    if verdict.status == "changed":
        entry = verdict.entry
        raise _fail(
            node,
            "hostkey-changed",
            f"{node}: HOST KEY CHANGED for {name}: the server now presents {fp}, "
            f"which differs from {entry.source}:{entry.line}; this may be an attack "
            "(someone intercepting the connection)",
            f"if the machine was reinstalled and you verified the new fingerprint out of band, "
            f"run `ssh-keygen -R '{name}' -f {entry.source}` and connect again",
        )
    if target.strict == "accept-new" and verdict.status == "unknown" and target.known_hosts_files:
        _record_host_key(target.known_hosts_files[0], name, key)
        return
    files = ", ".join(target.known_hosts_files) or "no known_hosts file"
    extra = (
        f" (keys of another type are known: {', '.join(verdict.known_types)})"
        if verdict.status == "other-type"
        else ""
    )
    raise _fail(
        node,
        "hostkey-unknown",
        f"{node}: host key for {name} is not known ({fp}){extra}; searched {files}",
        f"check the fingerprint with the machine's administrator (on the node: "
        f"`ssh-keygen -lf /etc/ssh/ssh_host_{key.get_name().removeprefix('ssh-')}_key.pub`), "
        f"then add it: `ssh-keyscan -p {target.port} {target.hostname} >> ~/.ssh/known_hosts`, "
        "or pass --accept-new-host-keys to record keys never seen before",
    )


# ----- authentication: keys only ---------------------------------------------------
def _load_private_key(path: str) -> paramiko.PKey | str:
    """The key, or a note saying why it cannot be used."""
    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        return f"{path} is passphrase-protected (load it into ssh-agent)"
    except (OSError, paramiko.SSHException, ValueError) as err:
        return f"{path}: {err}"


def _candidate_keys(target: SSHTarget) -> Iterator[paramiko.PKey | str]:
    files = list(target.identity_files)
    for path in files:
        if os.path.exists(path):
            yield _load_private_key(path)
    if target.use_agent and not target.identities_only and os.environ.get("SSH_AUTH_SOCK"):
        agent = paramiko.Agent()
        try:
            yield from agent.get_keys()
        finally:
            agent.close()
    if not files:
        for path in DEFAULT_IDENTITIES:
            expanded = os.path.expanduser(path)
            if os.path.exists(expanded):
                yield _load_private_key(expanded)


def _authenticate(transport: paramiko.Transport, target: SSHTarget, deadline: float) -> None:
    node = target.node
    notes: list[str] = []
    tried = 0
    for key in _candidate_keys(target):
        if isinstance(key, str):
            notes.append(key)
            continue
        transport.auth_timeout = max(0.1, deadline - time.monotonic())
        tried += 1
        try:
            remaining = transport.auth_publickey(target.user, key)
        except paramiko.BadAuthenticationType as err:
            raise _fail(
                node,
                "auth",
                f"{node}: the server does not accept keys for {target.user} "
                f"(it allows: {', '.join(err.allowed_types) or 'nothing'})",
                "orch uses key authentication only: enable PubkeyAuthentication on the node "
                "and install your public key in its ~/.ssh/authorized_keys",
            ) from err
        except paramiko.AuthenticationException:
            if time.monotonic() >= deadline:
                break
            continue
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise _fail(
                node,
                "auth",
                f"{node}: connection lost during authentication ({err or type(err).__name__})",
                "the server may limit authentication attempts (MaxAuthTries): set IdentityFile "
                "and IdentitiesOnly yes for this host in ~/.ssh/config",
            ) from err
        if transport.is_authenticated():
            return
        if remaining:
            raise _fail(
                node,
                "auth",
                f"{node}: the key was accepted but the server also asks for "
                f"{', '.join(remaining)}; orch never types passwords or codes",
                "allow key-only login for this user on the node (AuthenticationMethods)",
            )
    if time.monotonic() >= deadline:
        raise _fail(
            node,
            "timeout",
            f"{node}: authentication did not finish within the timeout",
            "the node is overloaded or its sshd is stuck; check it",
        )
    what = f"tried {tried} key(s)" if tried else "no usable key found"
    raise _fail(
        node,
        "auth",
        f"{node}: authentication rejected for {target.user}@{target.hostname} ({what}"
        + (f"; {'; '.join(notes)}" if notes else "")
        + "); no password is ever tried",
        f"install your public key on the node: `ssh-copy-id -p {target.port} "
        f"{target.user}@{target.hostname}`, or set IdentityFile for it in ~/.ssh/config",
    )


# ----- connecting --------------------------------------------------------------------
def _open_socket(target: SSHTarget, deadline: float) -> socket.socket:
    node = target.node
    timeout = max(0.1, deadline - time.monotonic())
    try:
        infos = socket.getaddrinfo(target.hostname, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise _fail(
            node,
            "resolve",
            f"{node}: host name {target.hostname!r} does not resolve ({err.strerror})",
            "fix the name in the hostfile, or add it to /etc/hosts, DNS, "
            "or a Host block with HostName in ~/.ssh/config",
        ) from err
    last: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
            return sock
        except OSError as err:
            sock.close()
            last = err
    where = f"{target.hostname}:{target.port}"
    if isinstance(last, ConnectionRefusedError):
        raise _fail(
            node,
            "refused",
            f"{node}: connection refused at {where} (no sshd listening)",
            "start sshd on the node, or fix Port for it in ~/.ssh/config",
        )
    if isinstance(last, (socket.timeout, TimeoutError)):
        raise _fail(
            node,
            "timeout",
            f"{node}: no answer from {where} within {timeout:.0f}s",
            "the node is down, frozen or firewalled; check it is up and port "
            f"{target.port} is open",
        )
    raise _fail(
        node,
        "other",
        f"{node}: cannot connect to {where} ({last})",
        "check the node is up and reachable from this machine",
    )


class _Hop:
    """A connection (jump host or proxy) a session depends on, closed with it."""

    def __init__(self, closer: Callable[[], None]) -> None:
        self.close = closer


def _handshake(target: SSHTarget, sock: object, deadline: float) -> paramiko.Transport:
    node = target.node
    transport = paramiko.Transport(sock)  # type: ignore[arg-type]
    remaining = max(0.1, deadline - time.monotonic())
    limit = remaining
    transport.banner_timeout = remaining
    transport.handshake_timeout = remaining
    entries = load_known_hosts(target.known_hosts_files)
    preferred = _preferred_host_key_types(entries, target.host_key_name)
    if preferred:
        options = transport.get_security_options()
        available = list(options.key_types)
        options.key_types = [t for t in preferred if t in available] + [
            t for t in available if t not in preferred
        ]
    try:
        transport.start_client(timeout=remaining)
        # start_client returns quietly when its timeout passes: ask for the key to know.
        server_key = transport.get_remote_server_key()
    except (paramiko.SSHException, EOFError, OSError) as err:
        transport.close()
        timed_out = time.monotonic() >= deadline - 0.05 or "banner" in str(err).lower()
        raise _fail(
            node,
            "timeout" if timed_out else "other",
            f"{node}: SSH handshake with {target.hostname}:{target.port} "
            + (
                f"timed out after {limit:.0f}s (the node or its sshd is not answering)"
                if timed_out
                else f"failed ({err or type(err).__name__})"
            ),
            "check that the node is up and not frozen or overloaded, and that sshd runs there",
        ) from err
    try:
        _verify_host_key(target, server_key)
        _authenticate(transport, target, deadline)
    except BaseException:
        transport.close()
        raise
    transport.set_keepalive(15)
    return transport


# The file-transfer client a session opens (sync and log collection use it): named here so
# that nothing outside ssh/ imports paramiko, even for a type.
SFTPClient = paramiko.SFTPClient


class NodeSession:
    """One authenticated SSH connection to one node (a context manager)."""

    def __init__(self, node: str, transport: paramiko.Transport, hops: list[_Hop]) -> None:
        self.node = node
        self._transport = transport
        self._hops = hops

    def __enter__(self) -> NodeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _channel(self, command: str, timeout: float) -> paramiko.Channel:
        try:
            channel = self._transport.open_session(timeout=timeout)
            channel.exec_command(command)
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise _fail(
                self.node,
                "other",
                f"{self.node}: could not start a command ({err or type(err).__name__})",
                "the connection dropped; check the node and its sshd (MaxSessions)",
            ) from err
        return channel

    def run(self, command: str, timeout: float, stdin: bytes | None = None) -> CommandResult:
        """Run a command, wait for it at most `timeout` seconds, collect its output."""
        deadline = time.monotonic() + timeout
        channel = self._channel(command, timeout)
        try:
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            return _collect(self.node, channel, deadline, timeout, [])
        finally:
            channel.close()

    def start(self, command: str, timeout: float = 10.0) -> RemoteProcess:
        """Start a command and return at once; read its output line by line."""
        return RemoteProcess(self.node, self._channel(command, timeout))

    def sftp(self) -> SFTPClient:
        client = self._transport.open_sftp_client()
        if client is None:
            raise _fail(
                self.node,
                "other",
                f"{self.node}: SFTP unavailable",
                "enable the sftp Subsystem in the node's sshd_config",
            )
        return client

    def close(self) -> None:
        self._transport.close()
        for hop in reversed(self._hops):
            with contextlib.suppress(Exception):
                hop.close()


def _collect(
    node: str, channel: paramiko.Channel, deadline: float, timeout: float, out: list[bytes]
) -> CommandResult:
    """Read stdout and stderr until the command exits; SSHError when the deadline passes."""
    err: list[bytes] = []
    while True:
        busy = False
        while channel.recv_ready():
            out.append(channel.recv(65536))
            busy = True
        while channel.recv_stderr_ready():
            err.append(channel.recv_stderr(65536))
            busy = True
        if channel.exit_status_ready() and not (
            channel.recv_ready() or channel.recv_stderr_ready()
        ):
            break
        if time.monotonic() >= deadline:
            raise _fail(
                node,
                "timeout",
                f"{node}: command did not finish within {timeout:g}s",
                "the node is slow or stuck; raise --timeout or check the node",
            )
        if not busy:
            time.sleep(_POLL_S)
    code = channel.recv_exit_status()
    # Output sent after the exit status, up to EOF.
    channel.settimeout(max(0.05, min(1.0, deadline - time.monotonic())))
    with contextlib.suppress(TimeoutError):
        while chunk := channel.recv(65536):
            out.append(chunk)
    while channel.recv_stderr_ready():
        err.append(channel.recv_stderr(65536))
    return CommandResult(node, code, b"".join(out), b"".join(err))


class RemoteProcess:
    """A command left running on a node; closing the channel hangs it up."""

    def __init__(self, node: str, channel: paramiko.Channel) -> None:
        self.node = node
        self._channel = channel
        self._buffer = b""

    def read_line(self, timeout: float) -> bytes | None:
        """The next stdout line, or None at EOF or when `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._channel.settimeout(min(remaining, 0.5))
            try:
                chunk = self._channel.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n"

    def send(self, data: bytes) -> None:
        """Write to the command's stdin."""
        self._channel.sendall(data)

    def wait(self, timeout: float) -> CommandResult:
        """Wait for the command to exit; its stdout holds what read_line did not return."""
        deadline = time.monotonic() + timeout
        try:
            with contextlib.suppress(OSError, EOFError):
                self._channel.shutdown_write()
            return _collect(self.node, self._channel, deadline, timeout, [self._buffer])
        finally:
            self._channel.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._channel.shutdown_write()
        self._channel.close()


def _connect(
    target: SSHTarget, deadline: float, config: paramiko.SSHConfig, accept_new: bool
) -> NodeSession:
    hops: list[_Hop] = []
    try:
        if target.proxy_jump:
            sock: object = _jump_channel(target, deadline, config, accept_new, hops)
        elif target.proxy_command:
            proxy = paramiko.ProxyCommand(target.proxy_command)
            hops.append(_Hop(proxy.close))
            sock = proxy
        else:
            sock = _open_socket(target, deadline)
        return NodeSession(target.node, _handshake(target, sock, deadline), hops)
    except BaseException:
        for hop in reversed(hops):
            with contextlib.suppress(Exception):
                hop.close()
        raise


def _jump_channel(
    target: SSHTarget,
    deadline: float,
    config: paramiko.SSHConfig,
    accept_new: bool,
    hops: list[_Hop],
) -> paramiko.Channel:
    """Connect through each ProxyJump host in turn; return a channel to the target."""
    sock: object | None = None
    chain = list(target.proxy_jump)
    for index, jump in enumerate(chain):
        hop_target = resolve_target(jump, config, accept_new=accept_new)
        # A jump host's own ProxyJump is not followed (OpenSSH would; rare in practice).
        hop_target = replace(hop_target, proxy_jump=(), proxy_command=None)
        if sock is None:
            sock = _open_socket(hop_target, deadline)
        transport = _handshake(hop_target, sock, deadline)
        hops.append(_Hop(transport.close))
        nxt = resolve_target(chain[index + 1], config) if index + 1 < len(chain) else target
        try:
            sock = transport.open_channel(
                "direct-tcpip",
                (nxt.hostname, nxt.port),
                ("127.0.0.1", 0),
                timeout=max(0.1, deadline - time.monotonic()),
            )
        except (paramiko.SSHException, OSError) as err:
            raise _fail(
                target.node,
                "other",
                f"{target.node}: jump host {jump} could not reach "
                f"{nxt.hostname}:{nxt.port} ({err})",
                "check ProxyJump in ~/.ssh/config and that the jump host can reach the node",
            ) from err
    assert isinstance(sock, paramiko.Channel)
    return sock


def open_session(
    node: str,
    *,
    timeout: float = 10.0,
    accept_new_host_keys: bool = False,
    config: paramiko.SSHConfig | None = None,
) -> NodeSession:
    """Connect and authenticate to one node within `timeout` seconds; SSHError if not."""
    config = config or load_ssh_config()
    target = resolve_target(node, config, accept_new=accept_new_host_keys)
    limit = min(timeout, target.connect_timeout) if target.connect_timeout else timeout
    deadline = time.monotonic() + limit
    try:
        return _connect(target, deadline, config, accept_new_host_keys)
    except SSHError:
        raise
    except Exception as err:  # anything paramiko raises that the steps did not name
        raise _fail(
            node,
            "other",
            f"{node}: SSH failed ({type(err).__name__}: {err})",
            "run `ssh -v " + shlex.quote(node) + " true` to see what the server says",
        ) from err


# ----- many nodes at once --------------------------------------------------------------
def failure_result(failure: SSHFailure) -> NodeResult:
    """An SSH failure as the node's failed result."""
    return failed(failure.node, failure.message, failure.hint, failure.kind)


def run_on_nodes(
    nodes: Sequence[str],
    command: str | Callable[[str], str],
    *,
    timeout: float = 30.0,
    max_parallel: int = 64,
    connect_timeout: float = 10.0,
    accept_new_host_keys: bool = False,
    stdin: bytes | None = None,
) -> GroupResult[CommandResult]:
    """Run a command on every node in parallel; one result per node, in order (a node
    succeeded when the command ran, whatever its exit code).

    A node's time is bounded by connect_timeout + timeout: a node that hangs
    delays the result by at most that, whatever the others do.
    """
    config = load_ssh_config() if nodes else None

    def one(node: str) -> NodeResult[CommandResult]:
        text = command(node) if callable(command) else command
        try:
            with open_session(
                node,
                timeout=connect_timeout,
                accept_new_host_keys=accept_new_host_keys,
                config=config,
            ) as session:
                return succeeded(node, session.run(text, timeout, stdin))
        except SSHError as err:
            return failure_result(err.failure)
        except Exception as err:
            return failed(
                node,
                f"{node}: {type(err).__name__}: {err}",
                "run `ssh -v " + shlex.quote(node) + " true` to see more",
                "other",
            )

    return for_each_node(nodes, one, max_parallel=max_parallel)
