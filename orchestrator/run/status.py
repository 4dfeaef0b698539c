"""The state `orch status` shows for a job: its record's, unless the head that runs it is
gone, or Slurm says otherwise of a batch job (squeue is asked here, not in the records)."""

from __future__ import annotations

from orchestrator.nodes import slurm
from orchestrator.outcome.states import JobState
from orchestrator.records.job import (
    FINAL_STATES,
    RUNNING_STATES,
    JobRecord,
    batch_state,
    head_alive,
)


def shown_state(record: JobRecord) -> str:
    """The state to show: a running job whose head process is gone is "head-died". A batch
    job's head runs on its allocation's first node: Slurm says whether it still runs."""
    if record.slurm_batch and record.slurm_job_id and record.state not in FINAL_STATES:
        return batch_state(record, slurm.job_state(record.slurm_job_id))
    if record.state in RUNNING_STATES and not head_alive(record):
        return JobState.HEAD_DIED
    return record.state
