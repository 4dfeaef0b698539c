"""A job's record as orch shows it: the JSON document `--json` prints, and the lines of
`orch status JOB` and a job's summary (attempts, root cause, requeue, environment)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from orchestrator.outcome.requeue import RequeueDecision
from orchestrator.records.job import AttemptRecord, EnvironmentRecord, FirstFailure, JobRecord
from orchestrator.run.status import shown_state
from orchestrator.specs.inventory import nodes_text
from orchestrator.specs.units import format_bytes


def record_document(record: JobRecord) -> dict:
    """The job's record as `--json` prints it (`orch status JOB --json`, `orch launch
    --json`): job.json, with the state as `orch status` shows it."""
    doc = record.to_json()
    doc["recorded_state"] = record.state
    doc["state"] = shown_state(record)
    return doc


def environment_line(kept: EnvironmentRecord | None) -> str:
    """`environment: 1a2b3c4d on every node, the head's; pushed to n2 (3.0 MiB)`: what the
    job's nodes ran, by fingerprint (the first 8 characters)."""
    if kept is None:
        return "environment: not looked at (no pre-flight)"
    groups: dict[str | None, list[str]] = {}
    for node, fingerprint in kept.nodes.items():
        groups.setdefault(fingerprint, []).append(node)
    if len(groups) == 1:
        [(only, _)] = groups.items()
        parts = [f"{(only or 'unknown')[:8]} on every node"]
    else:
        parts = [f"{(p or 'unknown')[:8]} on {nodes_text(n)}" for p, n in groups.items()]
    if kept.reference is not None:
        same = set(groups) == {kept.reference}
        parts.append("the head's" if same else f"the head's is {kept.reference[:8]}")
    text = "environment: " + ", ".join(parts)
    if kept.pushed:
        text += f"; pushed to {nodes_text(kept.pushed)} ({format_bytes(kept.pushed_bytes)})"
    return text


def print_root_cause(console: Console, failure: FirstFailure) -> None:
    """The failing rank's own traceback, first: the cascades on other ranks come after."""
    if not failure.traceback:
        return
    where = f"{failure.root_cause_node or '?'} rank {failure.root_cause_rank}"
    console.print(f"[bold]root cause[/]: {escape(where)}: {escape(failure.root_cause or '')}")
    for line in failure.traceback:
        console.print(f"  | {line}", markup=False, highlight=False)


def print_cause_notes(console: Console, failure: FirstFailure) -> None:
    """What followed the first failure, and what it means when it is not the script's own."""
    if failure.then:
        console.print(f"  {failure.then}", markup=False)
    if failure.hint:
        console.print(f"[bold]hint[/]: {escape(failure.hint)}")


def cause_text(attempt: AttemptRecord) -> str:
    """`signal: n2 rank 3: killed by SIGKILL; <what orch decided>`."""
    cause = attempt.cause
    if cause is None:
        return "succeeded"
    return f"{cause['message']} ({cause['decision']})"


def print_attempts(console: Console, attempts: tuple[AttemptRecord, ...]) -> None:
    """Each attempt of a job that had several, and why each ended."""
    if len(attempts) < 2:
        return
    allocations = max(attempt.allocation for attempt in attempts)
    across = f" in {allocations} Slurm allocations" if allocations > 1 else ""
    console.print(f"attempts: {len(attempts)}{across}")
    for attempt in attempts:
        code = "-" if attempt.exit_code is None else attempt.exit_code
        dropped = f"; dropped {', '.join(attempt.excluded)}" if attempt.excluded else ""
        where = f" (allocation {attempt.allocation})" if allocations > 1 else ""
        console.print(f"  {attempt.number}{where}: {', '.join(attempt.nodes)}: exit {code}: "
                      f"{cause_text(attempt)}{dropped}", markup=False)  # fmt: skip


def print_requeue(console: Console, decision: RequeueDecision | None) -> None:
    """--requeue: whether the batch job goes on in another allocation, and why."""
    if decision is not None:
        console.print(f"requeue: {decision.why}", markup=False)
