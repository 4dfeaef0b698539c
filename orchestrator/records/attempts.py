"""Each attempt's record and files kept apart in the job's directory: the latest attempt's
logs, raw node logs and stacks where they always are (logs/, nodes/, stacks/), every earlier
one's under attempts/<number>/; a requeued batch job's record carried into its next
allocation; and one attempt's directory and record found again by number (`orch logs
--attempt`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from orchestrator.outcome.states import JobState
from orchestrator.records.attempt_facts import attempt_record
from orchestrator.records.job import (
    ATTEMPTS_DIR,
    LOGS_DIR,
    NODES_DIR,
    REPORT_FILE,
    STACKS_DIR,
    TEARDOWN_UNANSWERED_FILE,
    AttemptRecord,
    JobRecord,
)
from orchestrator.records.rundir import RunDir

# What one attempt leaves in the job's directory, beside what the job keeps once.
PER_ATTEMPT = (LOGS_DIR, NODES_DIR, STACKS_DIR, TEARDOWN_UNANSWERED_FILE, REPORT_FILE)


def keep_apart(run: RunDir, attempt: AttemptRecord) -> AttemptRecord:
    """Move an attempt's logs, raw node logs and stacks to attempts/<number>/, before the
    next attempt writes its own in their place; the record says where they went. Moved
    within the job's directory, by names relative to it."""
    where = Path(ATTEMPTS_DIR) / str(attempt.number)
    run.mkdir(where.as_posix())
    for name in PER_ATTEMPT:
        if run.exists(name):
            run.rename(name, (where / name).as_posix())
    stacks = str(where / attempt.stacks) if attempt.stacks else None
    return replace(attempt, logs=str(where / LOGS_DIR), stacks=stacks)


def with_attempt(run: RunDir, record: JobRecord, attempt: AttemptRecord) -> JobRecord:
    """The job's record with this attempt added and the next one starting (its state is
    "starting" meanwhile, so `orch status` does not call the job failed)."""
    updated = replace(record, attempts=(*record.attempts, attempt), state=JobState.STARTING,
                      attempt=attempt.number + 1)  # fmt: skip
    run.save(updated)
    return updated


# The last attempt of an allocation whose end orch never wrote (the allocation ended first).
_UNRECORDED = {"class": "stopped", "message": "its Slurm allocation ended before orch wrote "
               "the attempt's end", "decision": "Slurm requeued the job"}  # fmt: skip


def carried_over(run: RunDir, record: JobRecord) -> JobRecord | None:
    """A batch job's record as its earlier allocations left it, when Slurm runs the job
    again (requeued by orch, by the script, or by Slurm): every attempt so far kept, the last
    one's files moved to attempts/<number>/, the allocation counted on. None: the job's
    first allocation (the record `orch submit --sbatch` wrote, queued, no attempt)."""
    if record.state == JobState.QUEUED and not record.attempts:
        return None
    attempts = record.attempts
    if record.attempt > len(attempts):  # its end never written: the allocation ended first
        attempts = (*attempts, replace(attempt_record(record, None), cause=_UNRECORDED))
    last = attempts[-1]
    if last.logs == LOGS_DIR:  # its files are where the next attempt writes its own
        attempts = (*attempts[:-1], keep_apart(run, last))
    updated = replace(record, attempts=attempts, allocation=record.allocation + 1)
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
