"""Writing a plan's files on the head: the record's (runs/<id>/, with a first job.json) and
the job's private ones (its env file with real values, the pdsh shim) in a directory only
the user can read, made new for the job and removed when it ends."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.outcome.states import JobState
from orchestrator.plan.launch_plan import Destination, LaunchPlan
from orchestrator.records.job import (
    ENV_FILE,
    EnvironmentRecord,
    JobRecord,
    now_iso,
    process_start_time,
)
from orchestrator.records.rundir import RunDir
from orchestrator.remote import owned

JOBS_DIR = "jobs"  # in the user's own directory on the head: one private directory per job


def head_private_dir(job_id: str) -> str:
    """The job's private directory on the head: in the user's own directory under the
    temporary directory (<tmp>/orch-<uid>/jobs/<job>; $XDG_RUNTIME_DIR/orch/jobs/<job> where
    another user made <tmp>/orch-<uid> first and that one lasts), never a name in the shared
    one that anyone who learns the job's id could take first (as <tmp>/orch-<job> was)."""
    user = owned.user_directory(os.getuid(), base=tempfile.gettempdir())
    return os.path.join(user, JOBS_DIR, job_id)


def write_private_files(plan: LaunchPlan) -> None:
    """The job's private files on the head (its env file with real values, the pdsh shim),
    in a directory only this user can read, made new for the job (never reused). The two
    levels above it (the user's own directory and its jobs/, as head_private_dir names them)
    are made and checked first: a link, another user's or one others can write is refused."""
    private = Path(plan.job.private_dir)
    files = [f for f in plan.files if f.where == Destination.PRIVATE]
    if not files:
        return
    jobs = private.parent
    try:
        owned.make_user_directory(str(jobs.parent), os.getuid(), way=owned.HEAD_WAY)
        owned.private_directories(str(jobs.parent), [jobs.name], os.getuid())
        private.mkdir(mode=0o700)
    except owned.UnsafeDirectory as err:
        raise OrchError(f"the job's private directory cannot be made: {err}",
                        "fix that directory as said, then launch again") from err  # fmt: skip
    except OSError as err:
        raise OrchError(
            f"cannot create the job's private directory {private}: {err}",
            "check that the temporary directory is writable (TMPDIR)",
        ) from err
    for planned in files:
        path = private / planned.name
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, planned.mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(planned.content)


def remove_private_files(plan: LaunchPlan) -> None:
    """The job's private directory on the head, gone with everything in it."""
    shutil.rmtree(plan.job.private_dir, ignore_errors=True)


def prepare_run(plan: LaunchPlan, run: RunDir, earlier: JobRecord | None = None,
                environment: EnvironmentRecord | None = None) -> JobRecord:  # fmt: skip
    """Write the plan's files and a first job.json (state "starting"). `earlier`: the record
    of the job's attempts so far, when this is a restart (its start and attempts stay);
    `environment`: the nodes' environments as the pre-flight found them (None: skipped).
    The job's directory is made new (a batch job's: made by `orch submit --sbatch`), in a
    runs directory of the user's own, and held (records/rundir.py)."""
    run.create(existing=plan.slurm_batch)
    for planned in plan.files:
        if planned.run_dir:
            run.write_file(planned.name, planned.content)
    run.write_file(ENV_FILE, json.dumps(plan.redacted_env, indent=2, sort_keys=True) + "\n")
    record = JobRecord(
        id=plan.job_id,
        state=JobState.STARTING,
        launcher=plan.launcher,
        command=plan.command,
        hosts=plan.hosts,
        workdir=plan.workdir,
        started_at=now_iso(),
        head_pid=os.getpid(),
        head_start=process_start_time(os.getpid()),
        node_exit_codes={host: None for host in plan.hosts},
        recipe=plan.recipe,
        name=plan.name,
        script=plan.job.script,
        python=plan.python,
        main_port=plan.main_port,
        main_port_chosen=plan.main_port_chosen,
        fanout=plan.job.fanout,
        slurm_job_id=plan.job.slurm_job or None,
        slurm_batch=plan.slurm_batch,
        transport=plan.transport,
        environment=environment,
        checkpoints=plan.checkpoints,
        node_root=plan.job.node_root,
    )
    record = replace(record, attempt_started=record.started_at)
    if earlier is not None:
        record = replace(record, started_at=earlier.started_at, attempts=earlier.attempts,
                         attempt=len(earlier.attempts) + 1,
                         allocation=earlier.allocation)  # fmt: skip
    run.save(record)
    return record
