"""An attempt's facts, from the job's record as the attempt's end left it: what the restart
policy reads of a failed attempt (outcome/restart_policy.py decides) and what the record
keeps of every attempt. Pure: record values in, values out."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.outcome.rank_ends import Role
from orchestrator.outcome.restart_policy import AttemptFailure, Cause, RestartDecision
from orchestrator.records.job import AttemptRecord, FirstFailure, JobRecord, RankRecord


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
        environment=record.environment, allocation=record.allocation,
    )  # fmt: skip


def _cause_json(cause: Cause, why: str) -> dict[str, str]:
    return {"class": str(cause.failure_class), "message": cause.message, "decision": why}
