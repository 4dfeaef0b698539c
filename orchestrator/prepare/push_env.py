"""`--push-env`: the job's pre-flight copies the head's environment to the nodes whose
environment is not the head's, then looks again.

Which nodes need it (`nodes_to_push`) and what the job's record keeps of every node's
environment (`environment_record`) are pure functions of the pre-flight's report; `push_to`
runs `orch env push`'s own push (envpush/push.py) on those nodes and says, per node, what it
did or why it could not; `push_fix` is the fix the findings name without `--push-env`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.checks.environment import PushFix, env_push_command
from orchestrator.checks.model import DoctorReport
from orchestrator.errors import NodesUnavailable, OrchError, UsageError
from orchestrator.nodes.transport import NodeTransport
from orchestrator.records.job import EnvironmentRecord


def push_fix(python: str, *, hostfile: str | None = None, slurm: bool = False,
             include: str | None = None, exclude: str | None = None,
             option: bool = False) -> PushFix | None:  # fmt: skip
    """The fix that copies the head's environment of `python` to these nodes: the `orch env
    push` command (None where the nodes come from no file nor allocation) and, with
    `option`, `--push-env`. None when `python` is in no environment orch can push."""
    from orchestrator.envpush.push import environment_source

    try:
        environment_source(python)
    except UsageError:
        return None
    command = None
    if hostfile is not None or slurm:
        command = env_push_command(python, hostfile=hostfile, slurm=slurm, include=include,
                                   exclude=exclude)  # fmt: skip
    return PushFix(command, option)


def node_fingerprints(report: DoctorReport) -> dict[str, str | None]:
    """Every node's environment fingerprint as the probe found it with the job's
    interpreter; None where the node gave no facts or has no such interpreter."""
    found: dict[str, str | None] = {}
    for status in report.nodes:
        facts = status.facts
        env = facts.environment if facts is not None and facts.python_found else None
        found[status.node] = env.fingerprint if env is not None else None
    return found


def nodes_to_push(report: DoctorReport) -> tuple[str, ...]:
    """The nodes that answered the probe and whose environment is not the head's (or that
    have no environment at the job's interpreter's path); none when the head's is unknown."""
    reference = report.head_fingerprint
    if reference is None:
        return ()
    reached = {s.node for s in report.nodes if s.facts is not None}
    prints = node_fingerprints(report)
    return tuple(n for n, p in prints.items() if n in reached and p != reference)


def environment_record(report: DoctorReport, pushed: PushDone | None = None) -> EnvironmentRecord:
    """What the job's record keeps of the environments its nodes ran: the head's fingerprint
    (None: the head has not the job's interpreter), every node's, and what was pushed."""
    return EnvironmentRecord(
        reference=report.head_fingerprint,
        nodes=node_fingerprints(report),
        pushed=pushed.nodes if pushed is not None else (),
        pushed_bytes=pushed.sent_bytes if pushed is not None else 0,
    )


@dataclass(frozen=True)
class PushDone:
    """A push before the job: where the environment went, what the head sent, how long."""

    root: str
    fingerprint: str
    nodes: tuple[str, ...]
    sent_bytes: int
    seconds: float


def push_to(nodes: Sequence[str], python: str, fix: str | None,
            transport: NodeTransport | None = None) -> PushDone:  # fmt: skip
    """Push the head's environment of `python` to `nodes`; OrchError naming every node it
    could not reach or refused, with its fix (`fix`: the command to push by hand)."""
    from orchestrator.envpush.push import environment_source, push_environment
    from orchestrator.prepare.preflight import head_environment

    source = environment_source(python)  # a UsageError when it is no environment
    head_env = head_environment(source.python)
    if head_env is None:
        raise OrchError(
            f"--push-env: {source.python} does not run on the head; nothing was started",
            f"check it with `{source.python} -c 'import sys'`",
        )
    started = time.monotonic()
    report = push_environment(list(nodes), source, head_env, transport=transport)
    failed = [r for r in report.nodes if not r.ok]
    if failed:
        lines = "\n  ".join(f"{r.problem}\n    fix: {r.hint}" for r in failed)
        by_hand = f", then push by hand (`{fix}`) or launch again" if fix else ", then launch again"
        raise NodesUnavailable(
            f"--push-env: the head's environment {source.root} could not be pushed to "
            f"{', '.join(r.node for r in failed)}; nothing was started:\n  {lines}",
            f"fix what is named above{by_hand}",
        )
    return PushDone(source.root, report.fingerprint, tuple(nodes), report.head_sent_bytes,
                    time.monotonic() - started)  # fmt: skip
