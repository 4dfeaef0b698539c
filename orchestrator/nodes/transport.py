"""Which way orch's own commands reach the nodes: over SSH (paramiko), or, inside a Slurm
allocation whose compute nodes refuse SSH, through srun steps. Both give one result per
node and a command left running that is read line by line, so the pre-flight, the job's
settings, the main port, the stacks and the raw logs do not care which it is.

Whether SSH is used is decided once, up front (`choose_transport`): as asked
(`--transport ssh|slurm`), else SSH unless the allocation's first node refuses it at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from orchestrator.errors import UsageError
from orchestrator.nodes.srun import StepProcess, StepSession, run_on_nodes_via_srun
from orchestrator.pernode import GroupResult, NodeResult, succeeded
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

SSH, SLURM = "ssh", "slurm"
NodeAccess = NodeSession | StepSession  # one node, for several commands and file copies
TRANSPORTS = (SSH, SLURM)
# An SSH answer that says "not here, ever", not "not yet": only these make orch go
# through Slurm by itself. A timeout could be a slow node, and a changed host key is a
# warning the user must see: neither is taken for a refusal.
_REFUSALS = ("auth", "refused", "resolve", "hostkey-unknown")


class StartedCommand(Protocol):
    node: str

    def read_line(self, timeout: float) -> bytes | None: ...

    def send(self, data: bytes) -> None: ...

    def wait(self, timeout: float) -> NodeResult[CommandResult]: ...

    def close(self) -> None: ...


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
class NodeTransport:
    """SSH by default; through Slurm's allocation `slurm_job` when that is set."""

    slurm_job: str = ""
    accept_new_host_keys: bool = False

    @classmethod
    def reaching(cls, kind: str, slurm_job: str | None) -> NodeTransport:
        """The way a plan's or a record's nodes are reached: through Slurm only when it
        says so and names an allocation (older records say neither)."""
        return cls(slurm_job=slurm_job or "") if kind == SLURM and slurm_job else cls()

    @property
    def kind(self) -> str:
        return SLURM if self.slurm_job else SSH

    def run(
        self,
        nodes: Sequence[str],
        command: str | Callable[[str], str],
        *,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        stdin: bytes | None = None,
        on_result: Callable[[NodeResult[CommandResult]], None] | None = None,
        time_shell: bool = False,
    ) -> GroupResult[CommandResult]:
        """`command` on every node, in parallel: one result per node, in order. `time_shell`:
        over SSH, the login shell's start-up is timed (ssh.session.ShellClock); srun starts
        no login shell, and only its marker is taken out."""
        if self.slurm_job:
            return run_on_nodes_via_srun(
                nodes, command, slurm_job=self.slurm_job, timeout=connect_timeout + timeout,
                stdin=stdin, on_result=on_result,
            )  # fmt: skip
        return run_on_nodes(
            nodes, command, timeout=timeout, connect_timeout=connect_timeout, stdin=stdin,
            accept_new_host_keys=self.accept_new_host_keys, on_result=on_result,
            time_shell=time_shell,
        )  # fmt: skip

    def session(self, node: str, *, timeout: float) -> NodeAccess:
        """One node, for several commands and file copies (a context manager). Over SSH one
        connection (SSHError when it cannot be opened); through Slurm, a step each time
        (StepError when one cannot run)."""
        if self.slurm_job:
            return StepSession(node, self.slurm_job)
        return open_session(node, timeout=timeout, config=load_ssh_config(),
                            accept_new_host_keys=self.accept_new_host_keys)  # fmt: skip

    def start(self, node: str, command: str, *, timeout: float,
              time_shell: bool = False) -> NodeResult[StartedCommand]:  # fmt: skip
        """`command` left running on `node`, or the node's failure to start it (`time_shell`
        as for `run`)."""
        if self.slurm_job:
            return succeeded(node, StepProcess(node, command, slurm_job=self.slurm_job))
        try:
            session = open_session(node, timeout=timeout, config=load_ssh_config(),
                                   accept_new_host_keys=self.accept_new_host_keys)  # fmt: skip
        except SSHError as err:
            return failure_result(err.failure)
        try:
            process = session.start(command, timeout, time_shell=time_shell)
        except SSHError as err:
            session.close()
            return failure_result(err.failure)
        return succeeded(node, _SshStarted(session, process))


def choose_transport(
    asked: str | None,
    *,
    slurm_job: str,
    first_node: str,
    say: Callable[[str], None],
    ssh_check: Callable[[str], NodeResult[object]] | None = None,
) -> NodeTransport:
    """`--transport` as asked; inside an allocation without it, SSH unless the first node
    refuses SSH at once (then Slurm only, said in one line). Outside one, SSH."""
    if asked is not None and asked not in TRANSPORTS:
        raise UsageError(f"--transport {asked!r} is not one of {', '.join(TRANSPORTS)}")
    if asked == SLURM and not slurm_job:
        raise UsageError("--transport slurm works inside a Slurm allocation only",
                         "run orch inside one (salloc), with --slurm")  # fmt: skip
    if asked == SLURM:
        return NodeTransport(slurm_job=slurm_job)
    if asked == SSH or not slurm_job:
        return NodeTransport()
    answer = (ssh_check or _ssh_answers)(first_node)
    if answer.ok or answer.kind not in _REFUSALS:
        return NodeTransport()
    say(f"SSH to {first_node} is refused ({answer.problem}): every node operation goes "
        f"through Slurm job {slurm_job} (srun)")  # fmt: skip
    return NodeTransport(slurm_job=slurm_job)


def _ssh_answers(node: str) -> NodeResult[object]:
    """One short SSH login to `node`, as a user's would be."""
    [result] = run_on_nodes([node], "true", timeout=5.0, connect_timeout=5.0)
    return result


def plan_transport(plan: LaunchPlan) -> NodeTransport:
    """The way the plan's nodes are reached."""
    return NodeTransport.reaching(plan.transport, plan.job.slurm_job)
