"""Taking every rank's stack (or a sampling profile) over SSH (or through Slurm where the
nodes refuse SSH), and keeping it in the record.

`gather_stacks` is the one way to do it: `orch stacks` calls it, and so can anything
else that wants the stacks of a running job (a hang, a teardown). Every node is asked
at once; each answers for itself, so one bad node never hides the others.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.nodes.transport import NodeTransport, SshTransport, plan_transport
from orchestrator.outcome.events import WatchSettings
from orchestrator.outcome.states import Failure, FailureKind
from orchestrator.pernode import NodeResult
from orchestrator.plan.agent_command import stacks_command
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.records.job import STACKS_DIR
from orchestrator.records.rundir import RunDir
from orchestrator.remote.stacks import STARTUP_SLACK_S
from orchestrator.ssh import CommandResult
from orchestrator.stacks.fold import FoldedStacks
from orchestrator.stacks.model import (
    BAD_OUTPUT,
    TIMEOUT,
    UNREACHABLE,
    NodeReport,
    failure_hint,
    node_failure,
    parse_node_report,
)
from orchestrator.stacks.report import StacksResult, analyse, merged_looks, needs_another_look

DEFAULT_RATE = 50  # samples per second and rank: cheap enough for many ranks on few cores
_CONNECT_TIMEOUT_S = 10.0


def gather_stacks(
    hosts: Sequence[str],
    job_id: str,
    python: str,
    timeout: float,
    *,
    profile_seconds: float | None = None,
    rate: int = DEFAULT_RATE,
    method: str = "auto",
    transport: NodeTransport | None = None,
    node_root: str = "",
) -> list[NodeReport]:
    """Every rank's stack on every host (a profile of `profile_seconds` when given), one
    report per host in order. Bounded: a host's answer takes at most `timeout` seconds
    (plus the profile's length), whatever the others do. method: "auto" (py-spy, and
    faulthandler where py-spy is missing or refused), "py-spy" or "faulthandler".
    `node_root`: the user's ORCH_NODE_ROOT, where the job's node directories are."""
    seconds = profile_seconds or 0.0
    budget = timeout + (seconds + STARTUP_SLACK_S if seconds else 0.0)

    def command(node: str) -> str:
        return stacks_command(python, job_id, node, seconds=seconds, rate=rate, method=method,
                              root=node_root)  # fmt: skip

    answers = (transport or SshTransport()).run(
        list(hosts), command, timeout=budget, connect_timeout=min(timeout, _CONNECT_TIMEOUT_S)
    )
    return [_node_report(answer, python, job_id) for answer in answers]


def _node_report(answer: NodeResult[CommandResult], python: str, job_id: str) -> NodeReport:
    node = answer.node
    if not answer.ok or answer.value is None:
        kind = TIMEOUT if answer.kind == "timeout" else UNREACHABLE
        return node_failure(node, kind, answer.problem or f"{node}: no answer", answer.hint or "")
    result = answer.value
    if result.exit_code != 0:
        lines = result.stderr.decode(errors="replace").strip().splitlines()
        said = lines[-1] if lines else f"exit code {result.exit_code}"
        return node_failure(
            node,
            BAD_OUTPUT,
            f"{node}: the stacks program failed ({said})",
            failure_hint(BAD_OUTPUT, python, job_id),
        )
    return parse_node_report(node, result.stdout.decode(errors="replace"), python, job_id)


def stacks_before_teardown(
    plan: LaunchPlan, failure: Failure, settings: WatchSettings, taken_at: Callable[[], str]
) -> tuple[StacksResult, tuple[FoldedStacks, ...]]:
    """Where the ranks still running stand before a failure's teardown, from every node but
    one found gone, bounded by the settings' stacks timeout; and, for a hang, the folds of
    the looks before the last (`look_at_a_hang`)."""
    gone = (failure.node,) if failure.kind in (FailureKind.SILENT, FailureKind.LOST) else ()
    hosts = [host for host in plan.hosts if host not in gone]
    hung = failure.kind == FailureKind.HANG
    timeout = settings.hang_stacks_timeout if hung else settings.stacks_timeout

    def take() -> list[NodeReport]:
        return gather_stacks(hosts, plan.job_id, plan.python, timeout,
                             transport=plan_transport(plan),
                             node_root=plan.job.node_root)  # fmt: skip

    if hung:
        return look_at_a_hang(take, plan.job_id, taken_at)
    return analyse(plan.job_id, taken_at(), None, take()), ()


def look_at_a_hang(
    take: Callable[[], list[NodeReport]], job_id: str, taken_at: Callable[[], str],
    pause: float = 1.0,
) -> tuple[StacksResult, tuple[FoldedStacks, ...]]:
    """A hung job's stacks, and the folds of the looks before the last: one look, and a
    second `pause` seconds later when the first leaves a rank unread or does not split the
    ranks into one block apart from a majority (a node slow to answer under load, a rank
    caught between two calls)."""
    first = analyse(job_id, taken_at(), None, take())
    if not needs_another_look(first):
        return first, ()
    time.sleep(pause)
    second = merged_looks(first, analyse(job_id, taken_at(), None, take()))
    return second, (first.folded,) if first.folded is not None else ()


def save_stacks(run: RunDir, document: dict) -> Path:
    """Keep one call's document as runs/<job>/stacks/<UTC time>.json, made new in the job's
    directory (never through a link); never overwrites."""
    run.mkdir(STACKS_DIR)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    text = json.dumps(document, indent=2) + "\n"
    suffix = 1
    while True:
        name = f"{stamp}.json" if suffix == 1 else f"{stamp}-{suffix}.json"
        try:
            fd = run.open(f"{STACKS_DIR}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            suffix += 1
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        return run.stacks / name
