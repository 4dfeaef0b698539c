"""`orch submit RECIPE --sbatch`: the request written into a batch script in the job's record,
submitted to Slurm, the Slurm job id recorded; the orch inside the allocation writes the rest
of the record as the job runs."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.nodes.slurm import submit_batch
from orchestrator.outcome.states import JobState
from orchestrator.plan.request import JobRequest, check_sbatch_hosts
from orchestrator.plan.sbatch_script import render_batch_script, request_batch, submit_argv
from orchestrator.records.job import SBATCH_SCRIPT_FILE, JobRecord, new_job_id, now_iso, runs_root
from orchestrator.records.rundir import run_dir
from orchestrator.specs.slurm import chosen_fanout


@dataclass(frozen=True)
class BatchJob:
    """A batch job written (and, unless a dry run, submitted): `slurm_job` None when not."""

    job_id: str
    script: str  # the batch script's text
    nodes: int
    output: Path  # where Slurm writes the batch job's own output
    slurm_job: str | None = None


def submit_batch_job(request: JobRequest, *, dry_run: bool) -> BatchJob:
    """Write the request's batch script and submit it (a dry run only writes the text)."""
    if request.recipe is None or request.spec.recipe is None:
        raise ValueError("a batch job runs a recipe")
    check_sbatch_hosts(request.hosts)
    job_id = new_job_id()
    root = runs_root(request.runs_dir)
    run = run_dir(root, job_id)
    output = run.sbatch_output
    command = submit_argv(request, python=sys.executable, job_id=job_id, runs_dir=str(root),
                          recipe=str(Path(request.spec.recipe).resolve()))  # fmt: skip
    batch = request_batch(request, job_id=job_id, cwd=os.getcwd(), output=str(output),
                          command=command)  # fmt: skip
    text = render_batch_script(batch)
    if dry_run:
        return BatchJob(job_id, text, batch.nodes, output)
    run.create()
    script = run.write_file(SBATCH_SCRIPT_FILE, text)
    slurm_job = submit_batch(str(script), cwd=batch.workdir)
    launcher = request.spec.launcher
    record = JobRecord(
        id=job_id, state=JobState.QUEUED, launcher=launcher, command=batch.command, hosts=(),
        workdir=batch.workdir, started_at=now_iso(), head_pid=0, head_start=None,
        recipe=request.spec.recipe, fanout=chosen_fanout(request.fanout, launcher, True),
        slurm_job_id=slurm_job, name=request.spec.name, script=request.spec.script,
        slurm_batch=True,
    )  # fmt: skip
    run.save(record)
    return BatchJob(job_id, text, batch.nodes, output, slurm_job)
