"""Connecting to a node: socket (or ProxyJump / ProxyCommand), handshake with a verified host
key, authentication by key only (nothing ever prompts), and the open session."""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import time
from collections.abc import Iterator
from dataclasses import replace

import paramiko

from orchestrator.ssh.config import DEFAULT_IDENTITIES, SSHTarget, load_ssh_config, resolve_target
from orchestrator.ssh.errors import SSHError, ssh_error
from orchestrator.ssh.known_hosts import (
    load_known_hosts,
    preferred_host_key_types,
    verify_host_key,
)
from orchestrator.ssh.session import Hop, NodeSession


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
            raise ssh_error(
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
            raise ssh_error(
                node,
                "auth",
                f"{node}: connection lost during authentication ({err or type(err).__name__})",
                "the server may limit authentication attempts (MaxAuthTries): set IdentityFile "
                "and IdentitiesOnly yes for this host in ~/.ssh/config",
            ) from err
        if transport.is_authenticated():
            return
        if remaining:
            raise ssh_error(
                node,
                "auth",
                f"{node}: the key was accepted but the server also asks for "
                f"{', '.join(remaining)}; orch never types passwords or codes",
                "allow key-only login for this user on the node (AuthenticationMethods)",
            )
    if time.monotonic() >= deadline:
        raise ssh_error(
            node,
            "timeout",
            f"{node}: authentication did not finish within the timeout",
            "the node is overloaded or its sshd is stuck; check it",
        )
    what = f"tried {tried} key(s)" if tried else "no usable key found"
    raise ssh_error(
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
        raise ssh_error(
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
        raise ssh_error(
            node,
            "refused",
            f"{node}: connection refused at {where} (no sshd listening)",
            "start sshd on the node, or fix Port for it in ~/.ssh/config",
        )
    if isinstance(last, (socket.timeout, TimeoutError)):
        raise ssh_error(
            node,
            "timeout",
            f"{node}: no answer from {where} within {timeout:.0f}s",
            "the node is down, frozen or firewalled; check it is up and port "
            f"{target.port} is open",
        )
    raise ssh_error(
        node,
        "other",
        f"{node}: cannot connect to {where} ({last})",
        "check the node is up and reachable from this machine",
    )


def _handshake(target: SSHTarget, sock: object, deadline: float) -> paramiko.Transport:
    node = target.node
    transport = paramiko.Transport(sock)  # type: ignore[arg-type]
    remaining = max(0.1, deadline - time.monotonic())
    limit = remaining
    transport.banner_timeout = remaining
    transport.handshake_timeout = remaining
    entries = load_known_hosts(target.known_hosts_files)
    preferred = preferred_host_key_types(entries, target.host_key_name)
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
        raise ssh_error(
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
        verify_host_key(target, server_key)
        _authenticate(transport, target, deadline)
    except BaseException:
        transport.close()
        raise
    transport.set_keepalive(15)
    return transport


# The file-transfer client a session opens (sync and log collection use it): named here so
# that nothing outside ssh/ imports paramiko, even for a type.
def _connect(
    target: SSHTarget, deadline: float, config: paramiko.SSHConfig, accept_new: bool
) -> NodeSession:
    hops: list[Hop] = []
    try:
        if target.proxy_jump:
            sock: object = _jump_channel(target, deadline, config, accept_new, hops)
        elif target.proxy_command:
            proxy = paramiko.ProxyCommand(target.proxy_command)
            hops.append(Hop(proxy.close))
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
    hops: list[Hop],
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
        hops.append(Hop(transport.close))
        nxt = resolve_target(chain[index + 1], config) if index + 1 < len(chain) else target
        try:
            sock = transport.open_channel(
                "direct-tcpip",
                (nxt.hostname, nxt.port),
                ("127.0.0.1", 0),
                timeout=max(0.1, deadline - time.monotonic()),
            )
        except (paramiko.SSHException, OSError) as err:
            raise ssh_error(
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
        raise ssh_error(
            node,
            "other",
            f"{node}: SSH failed ({type(err).__name__}: {err})",
            "run `ssh -v " + shlex.quote(node) + " true` to see what the server says",
        ) from err
