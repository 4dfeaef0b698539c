"""Which way orch's own commands reach the nodes: over SSH (paramiko, `SshTransport`), or,
inside a Slurm allocation whose compute nodes refuse SSH, through srun steps
(`SrunTransport`). Both are a `NodeTransport`: one result per node, a session for several
commands and file copies, and a command left running that is read line by line, so the
pre-flight, the job's settings, the main port, the stacks and the raw logs do not care
which it is (and tests hand them nodes/fake.py's).

Whether SSH is used is decided once, up front (`choose_transport`): as asked
(`--transport ssh|slurm`), else SSH unless the allocation's first node refuses it at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from orchestrator.errors import UsageError
from orchestrator.nodes.srun import StepProcess, StepSession, run_on_nodes_via_srun
from orchestrator.pernode import GroupResult, NodeResult, succeeded
from orchestrator.specs.constants import Transport
from orchestrator.ssh import (
    CommandResult,
    NodeSession,
    RemoteProcess,
    SSHError,
    failure_result,
    load_ssh_config,
    open_session,
    run_on_nodes,
)

if TYPE_CHECKING:
    from orchestrator.plan.launch_plan import LaunchPlan

SSH, SLURM = Transport.SSH, Transport.SLURM
TRANSPORTS = tuple(Transport)
# An SSH answer that says "not here, ever", not "not yet": only these make orch go
# through Slurm by itself. A timeout could be a slow node, and a changed host key is a
# warning the user must see: neither is taken for a refusal.
_REFUSALS = ("auth", "refused", "resolve", "hostkey-unknown")
OnResult = Callable[[NodeResult[CommandResult]], None]


class NodeAccess(Protocol):
    """One node, for several commands and file copies (a context manager): an SSH
    connection (ssh.NodeSession) or srun steps (srun.StepSession)."""

    node: str

    def __enter__(self) -> NodeAccess: ...

    def __exit__(self, *exc: object) -> None: ...

    def run(self, command: str, timeout: float, stdin: bytes | None = None) -> CommandResult: ...

    def download(self, remote: str, local: Path, timeout: float) -> None: ...


class StartedCommand(Protocol):
    node: str

    def read_line(self, timeout: float) -> bytes | None: ...

    def send(self, data: bytes) -> None: ...

    def wait(self, timeout: float) -> NodeResult[CommandResult]: ...

    def close(self) -> None: ...


class NodeTransport(Protocol):
    """The way orch's own commands reach the nodes."""

    @property
    def kind(self) -> Transport:
        """The word job.json keeps: how the job's nodes were reached."""
        ...

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
        """`command` on every node, in parallel: one result per node, in order (a node
        succeeded when the command ran, whatever its exit code). `time_shell`: the login
        shell's start-up is timed where there is one (ssh.session.ShellClock)."""
        ...

    def session(self, node: str, *, timeout: float) -> NodeAccess:
        """One node, for several commands and file copies. Raises what the node's failure
        is (SSHError, srun.StepError) when it cannot be reached."""
        ...

    def start(self, node: str, command: str, *, timeout: float,
              time_shell: bool = False) -> NodeResult[StartedCommand]:  # fmt: skip
        """`command` left running on `node`, or the node's failure to start it."""
        ...

    def by_hand(self, node: str, command: str) -> str:
        """How a user runs `command` (one shell word, quoted) on `node` from the head: for
        the hints that say what to do when orch could not."""
        ...


class _SshStarted:
    """An ssh session's command, with the session it holds."""

    def __init__(self, session: NodeSession, process: RemoteProcess) -> None:
        self.node = session.node
        self._session = session
        self._process = process

    def read_line(self, timeout: float) -> bytes | None:
        return self._process.read_line(timeout)

    def send(self, data: bytes) -> None:
        self._process.send(data)

    def wait(self, timeout: float) -> NodeResult[CommandResult]:
        try:
            return succeeded(self.node, self._process.wait(timeout))
        except SSHError as err:
            return failure_result(err.failure)

    def close(self) -> None:
        self._process.close()
        self._session.close()


@dataclass(frozen=True)
class SshTransport:
    """Over SSH, from the head (paramiko, the user's ssh_config and known hosts)."""

    accept_new_host_keys: bool = False

    @property
    def kind(self) -> Transport:
        return Transport.SSH

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
        return run_on_nodes(
            nodes, command, timeout=timeout, connect_timeout=connect_timeout, stdin=stdin,
            accept_new_host_keys=self.accept_new_host_keys, on_result=on_result,
            time_shell=time_shell,
        )  # fmt: skip

    def session(self, node: str, *, timeout: float) -> NodeSession:
        """One connection; SSHError when it cannot be opened."""
        return open_session(node, timeout=timeout, config=load_ssh_config(),
                            accept_new_host_keys=self.accept_new_host_keys)  # fmt: skip

    def start(self, node: str, command: str, *, timeout: float,
              time_shell: bool = False) -> NodeResult[StartedCommand]:  # fmt: skip
        try:
            session = self.session(node, timeout=timeout)
        except SSHError as err:
            return failure_result(err.failure)
        try:
            process = session.start(command, timeout, time_shell=time_shell)
        except SSHError as err:
            session.close()
            return failure_result(err.failure)
        return succeeded(node, _SshStarted(session, process))

    def by_hand(self, node: str, command: str) -> str:
        return f"ssh {node} {command}"


@dataclass(frozen=True)
class SrunTransport:
    """Through srun steps beside the job's, in Slurm allocation `slurm_job` (nodes/srun.py)."""

    slurm_job: str

    @property
    def kind(self) -> Transport:
        return Transport.SLURM

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
        """srun starts no login shell: `time_shell` only has its marker taken out."""
        return run_on_nodes_via_srun(
            nodes, command, slurm_job=self.slurm_job, timeout=connect_timeout + timeout,
            stdin=stdin, on_result=on_result,
        )  # fmt: skip

    def session(self, node: str, *, timeout: float) -> StepSession:
        """A step each time (StepError when one cannot run)."""
        return StepSession(node, self.slurm_job)

    def start(self, node: str, command: str, *, timeout: float,
              time_shell: bool = False) -> NodeResult[StartedCommand]:  # fmt: skip
        return succeeded(node, StepProcess(node, command, slurm_job=self.slurm_job))

    def by_hand(self, node: str, command: str) -> str:
        return f"srun --jobid={self.slurm_job} --overlap -N1 -n1 -w {node} sh -c {command}"


def reaching(kind: str, slurm_job: str | None) -> NodeTransport:
    """The way a plan's or a record's nodes are reached: through Slurm only when it says
    so and names an allocation (older records say neither)."""
    return SrunTransport(slurm_job) if kind == SLURM and slurm_job else SshTransport()


def choose_transport(
    asked: str | None,
    *,
    slurm_job: str,
    first_node: str,
    say: Callable[[str], None],
    ssh_check: Callable[[str], NodeResult[object]] | None = None,
    accept_new_host_keys: bool = False,
) -> NodeTransport:
    """`--transport` as asked; inside an allocation without it, SSH unless the first node
    refuses SSH at once (then Slurm only, said in one line). Outside one, SSH."""
    if asked is not None and asked not in TRANSPORTS:
        raise UsageError(f"--transport {asked!r} is not one of {', '.join(TRANSPORTS)}")
    if asked == SLURM and not slurm_job:
        raise UsageError("--transport slurm works inside a Slurm allocation only",
                         "run orch inside one (salloc), with --slurm")  # fmt: skip
    ssh = SshTransport(accept_new_host_keys=accept_new_host_keys)
    if asked == SLURM:
        return SrunTransport(slurm_job)
    if asked == SSH or not slurm_job:
        return ssh
    answer = (ssh_check or _ssh_answers)(first_node)
    if answer.ok or answer.kind not in _REFUSALS:
        return ssh
    say(f"SSH to {first_node} is refused ({answer.problem}): every node operation goes "
        f"through Slurm job {slurm_job} (srun)")  # fmt: skip
    return SrunTransport(slurm_job)


def _ssh_answers(node: str) -> NodeResult[object]:
    """One short SSH login to `node`, as a user's would be."""
    [result] = run_on_nodes([node], "true", timeout=5.0, connect_timeout=5.0)
    return result


def plan_transport(plan: LaunchPlan) -> NodeTransport:
    """The way the plan's nodes are reached."""
    return reaching(plan.transport, plan.job.slurm_job)
