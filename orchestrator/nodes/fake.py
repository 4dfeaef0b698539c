"""A node transport over scripted, in-memory nodes: the test double of `NodeTransport`,
shipped in the package as Fabric ships its own, so that what orch does over many nodes
(the pre-flight, the raw logs, the teardown, env push's look, the re-check between
attempts) is tested on values, with no sandbox and no child process. Nothing of orch's
own code uses it.

Each `FakeNode` answers a command by its handler: a callable given the `FakeCall`, or a
table whose first key found in the command gives the `Reply` (the key "" answers
anything). A node can be made unreachable, refuse, or time out; a reply can hang. Every
command the transport is asked to send is recorded (`calls`, `commands`), whether the node
answered or not, so a test says what orch sent where. A node's files are a dict, read and
written through its session (`download`, `upload`). Failures are given in the words and
kinds of the transport it stands for: SSH's, or srun's when `slurm_job` is set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.nodes.srun import StepError
from orchestrator.nodes.transport import OnResult, StartedCommand, reaching
from orchestrator.pernode import GroupResult, NodeResult, ShellStartup, failed, succeeded
from orchestrator.specs.constants import Transport
from orchestrator.ssh import CommandResult, SSHError, SSHFailure


@dataclass(frozen=True)
class Reply:
    """A command's answer: its exit code and output (str is taken as UTF-8). `hangs`: the
    command never ends, and the transport's timeout ends it."""

    exit_code: int = 0
    stdout: bytes | str = b""
    stderr: bytes | str = b""
    hangs: bool = False

    def result(self, node: str, shell: ShellStartup | None = None) -> CommandResult:
        return CommandResult(node, self.exit_code, _bytes(self.stdout), _bytes(self.stderr),
                             shell)  # fmt: skip


def _bytes(text: bytes | str) -> bytes:
    return text.encode() if isinstance(text, str) else text


@dataclass(frozen=True)
class FakeCall:
    """One command orch sent to a node. `how`: run, session (a session's command), start;
    `files`: the node's files, for a handler that answers from them."""

    node: str
    command: str
    how: str = "run"
    stdin: bytes = b""
    answered: bool = True  # False: the node was down, the command never reached it
    files: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)


Handler = Callable[[FakeCall], Reply] | Mapping[str, Reply]
NOT_SCRIPTED = 127  # the exit code of a command no handler answers: "command not found"
# What a node that is down says, by kind: (problem after the node's name, hint).
_DOWN = {
    "refused": ("connection refused", "check that sshd runs on the node"),
    "timeout": ("no answer within {timeout:g}s", "check that the node is up"),
    "unreachable": ("unreachable", "check that the node is up and on the network"),
    "resolve": ("no such host", "check the node's name"),
    "auth": ("authentication failed", "check your keys"),
}


@dataclass
class FakeNode:
    """A scripted node: `answer` answers its commands, `down` (a failure kind: refused,
    timeout, unreachable...) makes every command and session fail so, `files` are its
    files by path."""

    name: str
    answer: Handler = field(default_factory=dict)
    down: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)

    def refuse(self) -> FakeNode:
        self.down = "refused"
        return self

    def unreachable(self) -> FakeNode:
        self.down = "unreachable"
        return self

    def time_out(self) -> FakeNode:
        self.down = "timeout"
        return self

    def reply(self, call: FakeCall) -> Reply:
        if callable(self.answer):
            return self.answer(call)
        found = next((r for key, r in self.answer.items() if key in call.command), None)
        return found or Reply(NOT_SCRIPTED, stderr=f"fake {self.name}: no reply scripted for "
                                                   f"{call.command[:80]!r}\n")  # fmt: skip


def _late(node: str, timeout: float) -> NodeResult[CommandResult]:
    return failed(node, f"{node}: command did not finish within {timeout:g}s",
                  "the node is slow or stuck", "timeout")  # fmt: skip


class FakeTransport:
    """A NodeTransport over `FakeNode`s; a node it does not know does not resolve."""

    def __init__(self, nodes: Iterable[FakeNode] = (), *, slurm_job: str = "") -> None:
        self.nodes = {node.name: node for node in nodes}
        self.slurm_job = slurm_job  # set: it stands for srun steps in that allocation
        self.calls: list[FakeCall] = []
        self.started: list[FakeStarted] = []
        self.opened: list[str] = []  # the nodes a session was asked of, in order
        self._lock = threading.Lock()

    def node(self, name: str) -> FakeNode:
        return self.nodes[name]

    def commands(self, node: str) -> list[str]:
        """Every command sent to `node`, in order, answered or not."""
        return [c.command for c in self.calls if c.node == node]

    @property
    def kind(self) -> Transport:
        return Transport.SLURM if self.slurm_job else Transport.SSH

    def by_hand(self, node: str, command: str) -> str:
        return reaching(self.kind, self.slurm_job).by_hand(node, command)

    # ----- the nodes' answers -----------------------------------------------------------
    def _down(self, name: str, timeout: float) -> NodeResult[CommandResult] | None:
        node = self.nodes.get(name)
        kind = "resolve" if node is None else node.down
        if kind is None:
            return None
        said, hint = _DOWN.get(kind, (kind, "check the node"))
        return failed(name, f"{name}: {said.format(timeout=timeout)}", hint, kind)

    def _ask(self, name: str, command: str, how: str, stdin: bytes,
             timeout: float) -> NodeResult[CommandResult] | Reply:  # fmt: skip
        """The call recorded; the node's failure, or its reply."""
        down = self._down(name, timeout)
        node = self.nodes.get(name)
        call = FakeCall(name, command, how, stdin, down is None, node.files if node else {})
        with self._lock:
            self.calls.append(call)
        if down is not None:
            return down
        assert node is not None  # a node not scripted is down: it does not resolve
        return node.reply(call)

    def _raise(self, result: NodeResult[CommandResult]) -> None:
        """A node's failure as the transport it stands for raises it from a session."""
        if self.slurm_job:
            raise StepError(result)
        raise SSHError(SSHFailure(result.node, result.kind or "other", result.problem or "",
                                  result.hint or ""))  # fmt: skip

    # ----- NodeTransport ----------------------------------------------------------------
    def run(
        self,
        nodes: Sequence[str],
        command: str | Callable[[str], str],
        *,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        stdin: bytes | None = None,
        on_result: OnResult | None = None,
        time_shell: bool = False,
    ) -> GroupResult[CommandResult]:
        """One node after the other, in order (the order of the calls is the nodes')."""
        results = []
        for name in nodes:
            text = command(name) if callable(command) else command
            answer = self._ask(name, text, "run", stdin or b"", connect_timeout)
            if isinstance(answer, Reply):
                shell = ShellStartup(0.0, "") if time_shell and not self.slurm_job else None
                answer = _late(name, timeout) if answer.hangs else succeeded(
                    name, answer.result(name, shell))  # fmt: skip
            results.append(answer)
            if on_result is not None:
                on_result(answer)
        return GroupResult(tuple(results))

    def session(self, node: str, *, timeout: float) -> FakeSession:
        with self._lock:
            self.opened.append(node)
        down = self._down(node, timeout)
        if down is not None:
            self._raise(down)
        return FakeSession(self, node)

    def start(self, node: str, command: str, *, timeout: float,
              time_shell: bool = False) -> NodeResult[StartedCommand]:  # fmt: skip
        answer = self._ask(node, command, "start", b"", timeout)
        if not isinstance(answer, Reply):
            return answer  # type: ignore[return-value]
        started = FakeStarted(node, command, answer)
        with self._lock:
            self.started.append(started)
        return succeeded(node, started)


class FakeSession:
    """One fake node's session: its commands answered by its handler, its files copied
    from and to its `files`."""

    def __init__(self, transport: FakeTransport, node: str) -> None:
        self.node = node
        self._transport = transport
        self.closed = False

    def __enter__(self) -> FakeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True

    def run(self, command: str, timeout: float, stdin: bytes | None = None) -> CommandResult:
        answer = self._transport._ask(self.node, command, "session", stdin or b"", timeout)
        if isinstance(answer, Reply) and answer.hangs:
            answer = _late(self.node, timeout)
        if not isinstance(answer, Reply):
            self._transport._raise(answer)
        return answer.result(self.node)  # type: ignore[union-attr]

    def download(self, remote: str, local: Path, timeout: float) -> None:
        """The node's file `remote` into `local`; OSError when it has none."""
        files = self._transport.node(self.node).files
        if remote not in files:
            raise OSError(f"{self.node}: cat: {remote}: No such file or directory")
        local.write_bytes(files[remote])

    def upload(self, local: Path, remote: str) -> None:
        self._transport.node(self.node).files[remote] = local.read_bytes()


class FakeStarted:
    """A command left running on a fake node: its reply's stdout read line by line, what
    orch sends it kept in `sent`."""

    def __init__(self, node: str, command: str, reply: Reply) -> None:
        self.node, self.command, self.reply = node, command, reply
        self._lines = _bytes(reply.stdout).splitlines(keepends=True)
        self.sent = b""
        self.closed = False

    def read_line(self, timeout: float) -> bytes | None:
        """The next line; None at the end (a hanging command's end is the timeout's)."""
        return self._lines.pop(0) if self._lines else None

    def send(self, data: bytes) -> None:
        if self.closed:
            raise OSError(f"{self.node}: the channel closed")
        self.sent += data

    def wait(self, timeout: float) -> NodeResult[CommandResult]:
        if self.reply.hangs:
            self.closed = True
            return _late(self.node, timeout)
        rest, self._lines = b"".join(self._lines), []
        value = self.reply.result(self.node)
        return succeeded(self.node, CommandResult(self.node, value.exit_code, rest, value.stderr))

    def close(self) -> None:
        self.closed = True
