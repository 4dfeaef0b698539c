"""A job's attempts, on the head: the facts of a failed attempt as the restart policy reads
them (outcome/restart_policy.py decides), the short re-check of the nodes after it, and each
attempt's record and files kept apart in the job's directory: the latest attempt's logs,
raw node logs and stacks where they always are (logs/, nodes/, stacks/), every earlier
one's under attempts/<number>/."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from orchestrator.outcome.rank_ends import Role
from orchestrator.outcome.restart_policy import AttemptFailure, Cause, RestartDecision
from orchestrator.outcome.verdict import JobState
from orchestrator.records.job import (
    ATTEMPTS_DIR,
    LOGS_DIR,
    NODES_DIR,
    REPORT_FILE,
    STACKS_DIR,
    TEARDOWN_UNANSWERED_FILE,
    AttemptRecord,
    FirstFailure,
    JobRecord,
    RankRecord,
    RunDir,
)

# What one attempt leaves in the job's directory, beside what the job keeps once.
_PER_ATTEMPT = (LOGS_DIR, NODES_DIR, STACKS_DIR, TEARDOWN_UNANSWERED_FILE, REPORT_FILE)
RECHECK_CONNECT_S, RECHECK_TIMEOUT_S = 5.0, 10.0


def attempt_failure(first: FirstFailure, ranks: Sequence[RankRecord],
                    unreachable: Sequence[str]) -> AttemptFailure:  # fmt: skip
    """What the verdict found of a failed attempt, with the nodes the re-check missed."""
    cause = next((r for r in ranks if r.role == Role.CAUSE and r.rank == first.rank), None)
    return AttemptFailure(
        kind=first.kind, node=first.node, rank=first.rank,
        exit_code=first.exit_code if first.exit_code is not None else 1, reason=first.reason,
        signal=cause.signal if cause is not None else None,
        oom_kill=bool(cause.oom_kill) if cause is not None else False,
        exception=first.root_cause, traceback=first.traceback, unreachable=tuple(unreachable),
        hint=first.hint,
    )  # fmt: skip


def unreachable_nodes(nodes: Sequence[str]) -> tuple[str, ...]:
    """The nodes that do not run a trivial command over SSH within a few seconds."""
    from orchestrator.ssh import run_on_nodes

    if not nodes:
        return ()
    results = run_on_nodes(nodes, "true", timeout=RECHECK_TIMEOUT_S,
                           connect_timeout=RECHECK_CONNECT_S)  # fmt: skip
    return tuple(r.node for r in results if not r.ok or r.value.exit_code != 0)


def attempt_record(record: JobRecord, decision: RestartDecision | None,
                   excluded: Sequence[str] = ()) -> AttemptRecord:  # fmt: skip
    """The attempt that just ended, from the job's record as its end left it."""
    cause: dict[str, str] | None = None
    if decision is not None:
        cause = _cause_json(decision.cause, decision.why)
    return AttemptRecord(
        number=record.attempt, nodes=record.hosts,
        started=record.attempt_started or record.started_at,
        ended=record.ended_at, exit_code=record.exit_code, cause=cause,
        excluded=tuple(excluded), stacks=record.teardown_stacks,
        environment=record.environment,
    )  # fmt: skip


def _cause_json(cause: Cause, why: str) -> dict[str, str]:
    return {"class": str(cause.failure_class), "message": cause.message, "decision": why}


def keep_apart(run: RunDir, attempt: AttemptRecord) -> AttemptRecord:
    """Move an attempt's logs, raw node logs and stacks to attempts/<number>/, before the
    next attempt writes its own in their place; the record says where they went."""
    where = Path(ATTEMPTS_DIR) / str(attempt.number)
    target = run.path / where
    target.mkdir(parents=True, exist_ok=True)
    for name in _PER_ATTEMPT:
        source = run.path / name
        if source.exists():
            shutil.move(str(source), str(target / name))
    stacks = str(where / attempt.stacks) if attempt.stacks else None
    return replace(attempt, logs=str(where / LOGS_DIR), stacks=stacks)


def with_attempt(run: RunDir, record: JobRecord, attempt: AttemptRecord, *,
                 next_one: bool) -> JobRecord:  # fmt: skip
    """The job's record with this attempt added; `next_one`: another attempt follows (its
    state is "starting" meanwhile, so `orch status` does not call the job failed)."""
    updated = replace(record, attempts=(*record.attempts, attempt))
    if next_one:
        updated = replace(updated, state=JobState.STARTING, attempt=attempt.number + 1)
    run.save(updated)
    return updated


def attempt_run_dir(run: RunDir, record: JobRecord, number: int | None) -> tuple[RunDir, JobRecord]:
    """The directory and record of one attempt (None or the latest: the job's own), as
    `orch logs --attempt` reads them."""
    if number is None or number == record.attempt:
        return run, record
    found = next((a for a in record.attempts if a.number == number), None)
    if found is None:
        from orchestrator.errors import UsageError

        numbers = ", ".join(str(a.number) for a in record.attempts) or "1"
        raise UsageError(f"job {record.id} has no attempt {number}", f"its attempts: {numbers}")
    return run.attempt(number), replace(record, hosts=found.nodes)
