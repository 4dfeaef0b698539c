"""An open SSH session on one node: run a command with a timeout, start a remote process,
open SFTP."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import paramiko

from orchestrator.ssh.errors import ssh_error

_POLL_S = 0.02


class Hop:
    """A connection (jump host or proxy) a session depends on, closed with it."""

    def __init__(self, closer: Callable[[], None]) -> None:
        self.close = closer

@dataclass(frozen=True)
class CommandResult:
    node: str
    exit_code: int
    stdout: bytes
    stderr: bytes


SFTPClient = paramiko.SFTPClient


class NodeSession:
    """One authenticated SSH connection to one node (a context manager)."""

    def __init__(self, node: str, transport: paramiko.Transport, hops: list[Hop]) -> None:
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
            raise ssh_error(
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
            return _read_until_exit(self.node, channel, deadline, timeout, [])
        finally:
            channel.close()

    def start(self, command: str, timeout: float = 10.0) -> RemoteProcess:
        """Start a command and return at once; read its output line by line."""
        return RemoteProcess(self.node, self._channel(command, timeout))

    def sftp(self) -> SFTPClient:
        client = self._transport.open_sftp_client()
        if client is None:
            raise ssh_error(
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


def _read_until_exit(
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
            raise ssh_error(
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
            return _read_until_exit(self.node, self._channel, deadline, timeout, [self._buffer])
        finally:
            self._channel.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._channel.shutdown_write()
        self._channel.close()
