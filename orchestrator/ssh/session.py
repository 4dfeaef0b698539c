"""An open SSH session on one node: run a command with a timeout, start a remote process,
open SFTP."""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paramiko

from orchestrator.pernode import ShellStartup
from orchestrator.specs.constants import SHELL_UP_MARKER
from orchestrator.ssh.errors import ssh_error

_POLL_S = 0.02
STDERR_TAIL_LINES = 3
SEND_STALL_S = 120.0  # a command whose stdin takes nothing for this long is stuck
STDERR_LINE_CHARS = 240


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
    shell: ShellStartup | None = None  # the shell's start-up, when the command was timed


class ShellClock:
    """Times the user's shell on a node: the command prints SHELL_UP_MARKER on stderr
    first thing, so the marker's arrival ends the shell's start-up, and what came on stderr
    before it is what the start-up files printed. The marker is taken out of stderr."""

    MARKER = SHELL_UP_MARKER.encode() + b"\n"

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.startup: ShellStartup | None = None

    def look(self, err: list[bytes]) -> None:
        """After more stderr arrived (err is changed in place)."""
        if self.startup is not None:
            return
        joined = b"".join(err)
        where = joined.find(self.MARKER)
        if where < 0:
            return
        before = joined[:where]
        self.startup = ShellStartup(time.monotonic() - self.started, stderr_tail([before]))
        err[:] = [before + joined[where + len(self.MARKER) :]]


def stderr_tail(chunks: list[bytes]) -> str:
    """The last lines a node printed on stderr, as one line (` | ` between them)."""
    lines = b"".join(chunks).decode(errors="replace").replace("\r", "\n").splitlines()
    kept = [line.strip()[:STDERR_LINE_CHARS] for line in lines if line.strip()]
    return " | ".join(kept[-STDERR_TAIL_LINES:])


def _printed(tail: str) -> str:
    return f"; the node printed on stderr: {tail}" if tail else ""


SFTPClient = paramiko.SFTPClient


class NodeSession:
    """One authenticated SSH connection to one node (a context manager)."""

    def __init__(self, node: str, transport: paramiko.Transport, hops: list[Hop]) -> None:
        self.node = node
        self._transport = transport
        self._hops = hops
        self._sftp_offered: bool | None = None  # unknown until first asked

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

    def run(self, command: str, timeout: float, stdin: bytes | None = None,
            time_shell: bool = False) -> CommandResult:  # fmt: skip
        """Run a command, wait for it at most `timeout` seconds, collect its output. With
        `time_shell`, the command prints SHELL_UP_MARKER on stderr first (see ShellClock)."""
        deadline = time.monotonic() + timeout
        clock = ShellClock() if time_shell else None
        channel = self._channel(command, timeout)
        try:
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            return _read_until_exit(self.node, channel, deadline, timeout, [], clock)
        finally:
            channel.close()

    def start(self, command: str, timeout: float = 10.0, time_shell: bool = False) -> RemoteProcess:
        """Start a command and return at once; read its output line by line. With
        `time_shell`, as `run`."""
        clock = ShellClock() if time_shell else None
        return RemoteProcess(self.node, self._channel(command, timeout), clock)

    def sftp_if_offered(self, timeout: float) -> SFTPClient | None:
        """An SFTP client (its channel bounded by `timeout`), or None when the node's sshd
        offers no SFTP subsystem, as hardened clusters configure it (remembered)."""
        if self._sftp_offered is False:
            return None
        try:
            client = self._transport.open_sftp_client()
        except (paramiko.SSHException, EOFError):
            client = None
        self._sftp_offered = client is not None
        if client is not None:
            client.get_channel().settimeout(timeout)
        return client

    def download(self, remote: str, local: Path, timeout: float) -> None:
        """Copy one remote file to `local`: over SFTP when the node offers it, else as the
        output of `cat` on an exec channel. OSError when the file cannot be read."""
        client = self.sftp_if_offered(timeout)
        if client is None:
            self._cat(remote, local, timeout)
            return
        try:
            client.get(remote, str(local))
        finally:
            client.close()

    def _cat(self, remote: str, local: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        channel = self._channel(f"cat -- {shlex.quote(remote)}", timeout)
        errors: list[bytes] = []
        try:
            channel.shutdown_write()
            with local.open("wb") as out:
                while True:
                    channel.settimeout(max(0.1, deadline - time.monotonic()))
                    try:
                        chunk = channel.recv(1 << 16)
                    except TimeoutError as err:
                        said = _printed(stderr_tail(errors))
                        raise OSError(f"{self.node}: reading {remote} timed out{said}") from err
                    if not chunk:
                        break
                    out.write(chunk)
                    while channel.recv_stderr_ready():
                        errors.append(channel.recv_stderr(4096))
            code = channel.recv_exit_status()
        finally:
            channel.close()
        if code != 0:
            said = b"".join(errors).decode(errors="replace").strip() or f"cat exited {code}"
            raise OSError(f"{self.node}: {said}")

    def close(self) -> None:
        self._transport.close()
        for hop in reversed(self._hops):
            with contextlib.suppress(Exception):
                hop.close()


def _read_until_exit(
    node: str, channel: paramiko.Channel, deadline: float, timeout: float, out: list[bytes],
    clock: ShellClock | None = None, err: list[bytes] | None = None,
) -> CommandResult:  # fmt: skip
    """Read stdout and stderr until the command exits; SSHError when the deadline passes."""
    err = [] if err is None else err
    while True:
        busy = False
        while channel.recv_ready():
            out.append(channel.recv(65536))
            busy = True
        while channel.recv_stderr_ready():
            err.append(channel.recv_stderr(65536))
            busy = True
        if busy and clock is not None:
            clock.look(err)
        if channel.exit_status_ready() and not (
            channel.recv_ready() or channel.recv_stderr_ready()
        ):
            break
        if time.monotonic() >= deadline:
            tail = stderr_tail(err)
            raise ssh_error(
                node,
                "timeout",
                f"{node}: command did not finish within {timeout:g}s{_printed(tail)}",
                "the node is slow or stuck (or its shell start-up files wait for something: "
                "~/.bashrc); raise --timeout or check the node",
                stderr=tail,
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
    startup = None
    if clock is not None:
        clock.look(err)
        startup = clock.startup
    return CommandResult(node, code, b"".join(out), b"".join(err), startup)


class RemoteProcess:
    """A command left running on a node; closing the channel hangs it up."""

    def __init__(self, node: str, channel: paramiko.Channel,
                 clock: ShellClock | None = None) -> None:  # fmt: skip
        self.node = node
        self._channel = channel
        self._buffer = b""
        self._clock = clock
        self._err: list[bytes] = []

    def read_line(self, timeout: float) -> bytes | None:
        """The next stdout line, or None at EOF or when `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._read_stderr()
            self._channel.settimeout(min(remaining, 0.05 if self._clock else 0.5))
            try:
                chunk = self._channel.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n"

    def _read_stderr(self) -> None:
        # while waiting for stdout, so the shell's start-up is timed when it ends
        while self._channel.recv_stderr_ready():
            self._err.append(self._channel.recv_stderr(65536))
        if self._clock is not None:
            self._clock.look(self._err)

    def send(self, data: bytes) -> None:
        """Write to the command's stdin; OSError when the channel is gone, or when the
        command takes nothing for SEND_STALL_S (a slow reader only slows the writer)."""
        try:
            self._channel.settimeout(SEND_STALL_S)  # read_line leaves a short one
            self._channel.sendall(data)
        except (paramiko.SSHException, EOFError) as err:
            raise OSError(f"{self.node}: the channel closed: {err}") from err

    def wait(self, timeout: float) -> CommandResult:
        """Wait for the command to exit; its stdout holds what read_line did not return."""
        deadline = time.monotonic() + timeout
        try:
            with contextlib.suppress(OSError, EOFError):
                self._channel.shutdown_write()
            return _read_until_exit(self.node, self._channel, deadline, timeout, [self._buffer],
                                    self._clock, self._err)  # fmt: skip
        finally:
            self._channel.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._channel.shutdown_write()
        self._channel.close()
