"""From a plan to a finished job: sync -> pre-flight -> prepare the record -> run.

Each step either passes or raises OrchError before anything of the job has started;
what a step found goes to the caller's `PipelineReporter` (the CLI prints it).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from orchestrator.checks.model import DoctorReport
from orchestrator.errors import OrchError
from orchestrator.logs.sink import LogView
from orchestrator.pernode import GroupResult
from orchestrator.plan.launch_plan import HeadContext, LaunchPlan
from orchestrator.run.launch import JobRunner, LaunchResult, prepare_run
from orchestrator.run.pdsh import find_pdsh
from orchestrator.run.records import RunDir, run_dir
from orchestrator.run.sync import SyncedFiles
from orchestrator.run.verdict import WatchSettings


def head_context(job_id: str, *, dry_run: bool) -> HeadContext:
    """A real launch needs pdsh on the head; a dry run only shows where it would be."""
    pdsh = (shutil.which("pdsh") or "pdsh") if dry_run else find_pdsh()
    private = os.path.join(tempfile.gettempdir(), f"orch-{job_id}")
    return HeadContext(pdsh=pdsh, private_dir=private, orch_python=sys.executable)


class PipelineReporter(Protocol):
    def synced(self, plan: LaunchPlan, results: GroupResult[SyncedFiles]) -> None: ...

    def preflight_failed(self, report: DoctorReport) -> None: ...

    def started(self, plan: LaunchPlan, run: RunDir) -> None: ...


@dataclass(frozen=True)
class PipelineOptions:
    sync: bool = False  # copy the working directory to every node first
    preflight: bool = True
    keep_remote_logs: bool = False
    settings: WatchSettings = field(default_factory=WatchSettings)


def execute_plan(
    plan: LaunchPlan,
    root: Path,
    options: PipelineOptions,
    *,
    view: LogView | None,
    reporter: PipelineReporter,
) -> LaunchResult:
    """Run the plan to its end; SIGINT and SIGTERM tear the job down on every node."""
    if options.sync:
        _sync(plan, reporter)
    if options.preflight:
        _preflight(plan, reporter)
    run = run_dir(root, plan.job_id)
    record = prepare_run(plan, run)
    runner = JobRunner(
        plan, run, record, settings=options.settings, view=view,
        keep_remote_logs=options.keep_remote_logs,
    )  # fmt: skip
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: runner.interrupt(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    reporter.started(plan, run)
    try:
        return runner.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _sync(plan: LaunchPlan, reporter: PipelineReporter) -> None:
    from orchestrator.run.sync import sync_workdir

    results = sync_workdir(plan.hosts, os.getcwd(), plan.workdir)
    reporter.synced(plan, results)
    failed = [r.node for r in results.failed]
    if failed:
        raise OrchError(
            f"--sync could not copy {os.getcwd()} to {', '.join(failed)}; nothing was started",
            "fix the problems above (`orch doctor --hostfile F` checks SSH), then launch again",
        )


def _preflight(plan: LaunchPlan, reporter: PipelineReporter) -> None:
    from orchestrator.run.preflight import run_preflight

    report = run_preflight(
        plan.hostfile,
        python=plan.python,
        workdir=plan.workdir,
        script=plan.script,
        main_port=plan.main_port,
    )
    if report.ok:
        return
    reporter.preflight_failed(report)
    raise OrchError(
        f"pre-flight failed on {len({f.node for f in report.errors})} node(s); nothing was started",
        "fix the findings above (see `orch doctor --hostfile F`), or pass --no-doctor",
    )
