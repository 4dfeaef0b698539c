"""Many nodes at once: a command on every node in parallel, one result per node."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence

from orchestrator.pernode import GroupResult, NodeResult, failed, for_each_node, succeeded
from orchestrator.ssh.config import load_ssh_config
from orchestrator.ssh.connect import open_session
from orchestrator.ssh.errors import SSHError, SSHFailure
from orchestrator.ssh.session import CommandResult


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
    on_result: Callable[[NodeResult[CommandResult]], None] | None = None,
    time_shell: bool = False,
) -> GroupResult[CommandResult]:
    """Run a command on every node in parallel; one result per node, in order (a node
    succeeded when the command ran, whatever its exit code). With `time_shell`, the
    command prints SHELL_UP_MARKER on stderr first thing, and the result says how long the
    user's shell took to start and what it printed (see session.ShellClock).

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
                return succeeded(node, session.run(text, timeout, stdin, time_shell))
        except SSHError as err:
            return failure_result(err.failure)
        except Exception as err:
            return failed(
                node,
                f"{node}: {type(err).__name__}: {err}",
                "run `ssh -v " + shlex.quote(node) + " true` to see more",
                "other",
            )

    return for_each_node(nodes, one, max_parallel=max_parallel, on_result=on_result)
