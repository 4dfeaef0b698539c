"""Node commands through Slurm, for allocations whose compute nodes refuse SSH: the same
contract as `ssh.run_on_nodes` (one result per node, in order, each bounded by a timeout)
and as an ssh session's `start` (a command left running, read line by line), through srun
steps beside the job's (plan/srun_command.py builds the argv): the same command on many
nodes is one step with a task per node, a command of one node its own step.

What ssh gives by its channel, srun gives by its pipes: stdin goes to the command (so a
secret never sits on a command line), stdout and stderr come back apart, the exit code is
the command's. A step that never started (node down, step refused) is told apart from a
command that failed by the line the step prints first on stderr."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from orchestrator.pernode import GroupResult, NodeResult, failed, for_each_node, succeeded
from orchestrator.plan.srun_command import (
    STEP_EXIT,
    STEP_STARTED,
    node_step_argv,
)
from orchestrator.specs.constants import SHELL_UP_MARKER
from orchestrator.ssh import CommandResult
from orchestrator.ssh.session import stderr_tail

_STARTED = STEP_STARTED.encode() + b"\n"
_SHELL_UP = SHELL_UP_MARKER.encode() + b"\n"
_STOP_GRACE_S = 5.0  # srun passes SIGTERM on to the command; then it is killed
# What srun and slurmstepd say about the step itself, not the command's own words.
_SLURMS_OWN = re.compile(
    rb"^(?:srun: error: \S+: tasks? [0-9,-]+: |slurmstepd(?:-\S+)?: error: \*\*\* STEP )"
    rb"[^\n]*(?:\n|\Z)",
    re.MULTILINE,
)


def commands_stderr(stderr: bytes) -> bytes:
    """A step's stderr without srun's and slurmstepd's lines about the step (its exit code,
    its cancellation) and without the line a command prints when a login shell has started
    it (srun starts none): what the command printed, as ssh would give it."""
    stderr = stderr.replace(_STARTED, b"").replace(_SHELL_UP, b"")
    return _SLURMS_OWN.sub(b"", stderr)


def _started(node: str, code: int, stdout: bytes, stderr: bytes) -> NodeResult[CommandResult]:
    """The command's result, or the node's failure when srun never started it."""
    before, marker, after = stderr.partition(_STARTED)
    if not marker:
        said = stderr_tail([stderr]) or f"srun exited {code}"
        return failed(
            node,
            f"{node}: Slurm could not run a step there: {said}",
            "check the node with `sinfo -N -l` and `scontrol show node`",
            "unreachable",
        )
    return succeeded(node, CommandResult(node, code, stdout, commands_stderr(before + after)))


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End a step that outlived its time: srun forwards SIGTERM to the command and ends the
    step; a srun that does not end by then is killed."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _spawn(nodes: Sequence[str], command: str, *, slurm_job: str,
           environ: Mapping[str, str] | None = None, stdin: int = subprocess.PIPE,
           stdout: int | IO[bytes] = subprocess.PIPE) -> subprocess.Popen[bytes]:  # fmt: skip
    """srun running `command` on `nodes` (plan/srun_command.py), stderr piped; srun reads
    the head's environment for itself, and exports only part of it to the nodes."""
    env = dict(os.environ if environ is None else environ)
    argv = node_step_argv(nodes, command, slurm_job=slurm_job, environ=env)
    return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, env=env)


def run_step(
    node: str,
    command: str,
    *,
    slurm_job: str,
    timeout: float,
    stdin: bytes | None = None,
    environ: Mapping[str, str] | None = None,
) -> NodeResult[CommandResult]:
    """One command on one node, through its own srun step, bounded by `timeout`."""
    try:
        process = _spawn([node], command, slurm_job=slurm_job, environ=environ)
    except FileNotFoundError:
        return failed(node, f"{node}: srun is not installed on this machine",
                      "run orch on a Slurm login node", "other")  # fmt: skip
    try:
        stdout, stderr = process.communicate(stdin or b"", timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        _stdout, stderr = process.communicate()
        return _late(node, timeout, stderr)
    return _started(node, process.returncode, stdout, stderr)


_LABELLED = re.compile(rb"^ *(\d+): ?(.*)$")


@dataclass
class _Task:
    node: str = ""
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exit_code: int | None = None


def _unhex(line: bytes) -> bytes:
    """A line of od's hex bytes; a line that is not one (a cut or foreign line) is lost, not
    mistaken for output."""
    try:
        return bytes.fromhex(line.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return b""


def split_tasks(stdout: bytes, stderr: bytes) -> dict[str, CommandResult]:
    """One labelled step's output (`srun --label`) as each node's own: its stdout (sent as
    hex), its stderr lines, and its exit code (-1: it did not say, so it did not finish).
    Nodes are known by the line each task says first; lines without a label are srun's."""
    tasks: dict[int, _Task] = {}
    for stream, data in (("stdout", stdout), ("stderr", stderr)):
        for line in data.splitlines(keepends=True):
            match = _LABELLED.match(line.rstrip(b"\n"))
            if match is None:
                continue
            task = tasks.setdefault(int(match.group(1)), _Task())
            text = match.group(2)
            if stream == "stderr" and text.startswith(_STARTED.rstrip()):
                task.node = text[len(_STARTED):].decode(errors="replace").strip()
            elif stream == "stderr" and text.startswith(STEP_EXIT.encode() + b" "):
                code = text.split(b" ", 1)[1].strip()
                task.exit_code = int(code) if code.isdigit() else None
            elif stream == "stdout":
                task.stdout.extend(_unhex(text))
            else:
                task.stderr.extend(text + b"\n")
    return {
        task.node: CommandResult(task.node, -1 if task.exit_code is None else task.exit_code,
                                 bytes(task.stdout), commands_stderr(bytes(task.stderr)))
        for task in tasks.values() if task.node
    }  # fmt: skip


Answers = dict[str, NodeResult[CommandResult]]


def _within(process: subprocess.Popen[bytes], stdin: bytes,
            timeout: float) -> tuple[bytes, bytes, bool]:  # fmt: skip
    """A labelled step's stdout and stderr, and whether it ran past `timeout` (then it is
    stopped). A task's exit line that arrives after the time is dropped: its command ended
    because the step was stopped, not by itself."""
    deadline = time.monotonic() + timeout
    out: list[bytes] = []
    err: list[bytes] = []

    def read_err() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            late = time.monotonic() > deadline and STEP_EXIT.encode() in line
            if not late:
                err.append(line)

    def read_out() -> None:
        assert process.stdout is not None
        out.append(process.stdout.read())

    readers = [threading.Thread(target=f, daemon=True) for f in (read_err, read_out)]
    for reader in readers:
        reader.start()
    with contextlib.suppress(OSError):
        assert process.stdin is not None
        process.stdin.write(stdin)
        process.stdin.close()
    try:
        process.wait(max(0.0, deadline - time.monotonic()))
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(process)
    for reader in readers:
        reader.join(_STOP_GRACE_S)
    return b"".join(out), b"".join(err), timed_out


def _one_step(nodes: Sequence[str], command: str, *, slurm_job: str, timeout: float,
              stdin: bytes | None, environ: Mapping[str, str]) -> Answers | None:  # fmt: skip
    """The same command on every node as one step: each node's result, or None when the
    step never started (a node down or refused fails the whole step: each is then asked
    on its own, so that one bad node never hides the others)."""
    try:
        process = _spawn(nodes, command, slurm_job=slurm_job, environ=environ)
    except FileNotFoundError:
        return None  # each node's own step says srun is missing
    stdout, stderr, timed_out = _within(process, stdin or b"", timeout)
    answers = split_tasks(stdout, stderr)
    if not answers:
        return None
    results: Answers = {}
    for node in nodes:
        answer = answers.get(node)
        if answer is not None and answer.exit_code >= 0:
            results[node] = succeeded(node, answer)
        elif timed_out:
            results[node] = _late(node, timeout, answer.stderr if answer else b"")
        else:
            said = stderr_tail([stderr]) or f"srun exited {process.returncode}"
            results[node] = failed(node, f"{node}: its task ended without an answer: {said}",
                                   "check the node with `scontrol show node`", "other")  # fmt: skip
    return results


def _late(node: str, timeout: float, stderr: bytes) -> NodeResult[CommandResult]:
    """A command still running after `timeout`, with what it printed on stderr so far: a
    login shell's start-up that waits on a lock says so there."""
    tail = stderr_tail([commands_stderr(stderr)])
    said = f"; it printed on stderr: {tail}" if tail else ""
    return failed(
        node,
        f"{node}: command did not finish within {timeout:g}s (through srun){said}",
        "the node is slow or stuck: check it with `scontrol show node`",
        "timeout",
    )


def run_on_nodes_via_srun(
    nodes: Sequence[str],
    command: str | Callable[[str], str],
    *,
    slurm_job: str,
    timeout: float = 30.0,
    max_parallel: int = 64,
    stdin: bytes | None = None,
    on_result: Callable[[NodeResult[CommandResult]], None] | None = None,
) -> GroupResult[CommandResult]:
    """A command on every node: one result per node, in order. The same command everywhere
    is one step of one task per node; one that differs per node is a step per node, in
    parallel."""
    environ = dict(os.environ)
    if isinstance(command, str) and len(nodes) > 1:
        together = _one_step(nodes, command, slurm_job=slurm_job, timeout=timeout,
                             stdin=stdin, environ=environ)  # fmt: skip
        if together is not None:
            for node in nodes:
                if on_result is not None:
                    on_result(together[node])
            return GroupResult(tuple(together[node] for node in nodes))

    def one(node: str) -> NodeResult[CommandResult]:
        text = command(node) if callable(command) else command
        return run_step(node, text, slurm_job=slurm_job, timeout=timeout, stdin=stdin,
                        environ=environ)  # fmt: skip

    return for_each_node(nodes, one, max_parallel=max_parallel, on_result=on_result)


class StepProcess:
    """A command left running on a node in its own srun step, read line by line: what
    `NodeSession.start` gives over ssh. Closing it ends the step."""

    def __init__(self, node: str, command: str, *, slurm_job: str) -> None:
        self.node = node
        self._process = _spawn([node], command, slurm_job=slurm_job)
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    def _read_stdout(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        self._stderr.append(self._process.stderr.read())

    def read_line(self, timeout: float) -> bytes | None:
        """The next stdout line, or None at EOF or when `timeout` passes first."""
        try:
            line = self._lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if line is None:
            self._lines.put(None)  # EOF stays EOF
        return line

    def send(self, data: bytes) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(data)
        self._process.stdin.flush()

    def wait(self, timeout: float) -> NodeResult[CommandResult]:
        """Wait for the command to end: its result holds the stdout read_line did not
        return. A command still running after `timeout` is stopped and its node failed."""
        deadline = time.monotonic() + timeout
        with contextlib.suppress(OSError):
            assert self._process.stdin is not None
            self._process.stdin.close()
        try:
            self._process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.close()
            return failed(self.node, f"{self.node}: command did not finish within "
                          f"{timeout:g}s (through srun)", "the node is slow or stuck",
                          "timeout")  # fmt: skip
        stdout = b"".join(iter(self._drained, None))
        self._stderr_reader.join(_STOP_GRACE_S)
        return _started(self.node, self._process.returncode, stdout, b"".join(self._stderr))

    def _drained(self) -> bytes | None:
        try:
            return self._lines.get(timeout=_STOP_GRACE_S)
        except queue.Empty:
            return None

    def close(self) -> None:
        if self._process.poll() is None:
            _stop(self._process)


class StepError(Exception):
    """A node command's step failed to run (not the command: the step)."""

    def __init__(self, result: NodeResult[CommandResult]) -> None:
        super().__init__(result.problem or f"{result.node}: no answer")
        self.result = result


class StepSession:
    """What an ssh session gives the raw-log collection, through srun steps: a command's
    result, and a file copied back (as `cat` output, streamed to disk)."""

    def __init__(self, node: str, slurm_job: str) -> None:
        self.node, self.slurm_job = node, slurm_job

    def __enter__(self) -> StepSession:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def run(self, command: str, timeout: float, stdin: bytes | None = None) -> CommandResult:
        result = run_step(self.node, command, slurm_job=self.slurm_job, timeout=timeout,
                          stdin=stdin)  # fmt: skip
        if result.value is None:
            raise StepError(result)
        return result.value

    def download(self, remote: str, local: Path, timeout: float) -> None:
        """Copy one file of the node to `local`. OSError when it cannot be read."""
        with local.open("wb") as out:
            process = _spawn([self.node], f"cat -- {shlex.quote(remote)}",
                             slurm_job=self.slurm_job, stdin=subprocess.DEVNULL, stdout=out)
            try:
                _out, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired as err:
                _stop(process)
                raise OSError(f"{self.node}: reading {remote} timed out") from err
        result = _started(self.node, process.returncode, b"", stderr)
        if result.value is None:
            raise OSError(result.problem)
        if result.value.exit_code != 0:
            said = result.value.stderr.decode(errors="replace").strip()
            raise OSError(f"{self.node}: {said or f'cat exited {result.value.exit_code}'}")
