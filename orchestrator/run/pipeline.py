"""From a plan to a finished job: sync -> the job's private settings on every node, while
node 0 picks the main port -> pre-flight -> prepare the record -> run.

Each step either passes or raises OrchError before anything of the job has started (and
then the private settings written so far are removed again); what a step found goes to
the caller's `PipelineReporter` (the CLI prints it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
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
    with_port: Callable[[], LaunchPlan] | None = None,
) -> LaunchResult:
    """Run the plan to its end; SIGINT and SIGTERM tear the job down on every node.
    `with_port`, when given, returns the plan with the main port node 0 picked for it."""
    if options.sync:
        _sync(plan, reporter)
    plan = _settings_and_port(plan, with_port)
    try:
        if options.preflight:
            _preflight(plan, reporter)
    except BaseException:
        _remove_node_private(plan)
        raise
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


def _settings_and_port(plan: LaunchPlan, with_port: Callable[[], LaunchPlan] | None) -> LaunchPlan:
    """The job's private settings written on every node while node 0 picks the port: they
    do not depend on it, and each is a round trip over SSH before anything starts."""
    if with_port is None:
        _write_node_private(plan)
        return plan
    failure: list[BaseException] = []

    def write() -> None:
        try:
            _write_node_private(plan)
        except BaseException as err:  # raised again below, in the caller's thread
            failure.append(err)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        ported = with_port()
    except BaseException:
        writer.join()
        _remove_node_private(plan)
        raise
    writer.join()
    if failure:
        _remove_node_private(plan)
        raise failure[0]
    if ported.node_private != plan.node_private:  # never expected: the port is not in them
        _write_node_private(ported)
    return ported


def _remove_node_private(plan: LaunchPlan) -> None:
    """Nothing started: the settings written on the nodes (secrets among them) go again.
    Best effort: a node that cannot be reached keeps a file only this user can read."""
    from orchestrator.remote.agent import node_dir
    from orchestrator.ssh import run_on_nodes

    def command(node: str) -> str:
        return f"rm -rf -- {shlex.quote(node_dir(plan.job_id, node))}"

    run_on_nodes(plan.hosts, command, timeout=10.0, connect_timeout=5.0)


def _write_node_private(plan: LaunchPlan) -> None:
    """The job's environment and the rank's command, on every node, readable by the user
    only, sent over ssh's own channel (stdin): never on a command line, on the head or a
    node. The agent checks its hash, takes it in, and removes it."""
    from orchestrator.remote.agent import PRIVATE_FILE, node_dir
    from orchestrator.ssh import run_on_nodes

    def command(node: str) -> str:
        directory = shlex.quote(node_dir(plan.job_id, node))
        target = f"{directory}/{PRIVATE_FILE}"
        # The file, not the shared /tmp/orch-runs above it, is private to the user.
        return (
            f"mkdir -p {directory} && umask 077 && cat > {target}.part && "
            f"mv -f {target}.part {target}"
        )

    results = run_on_nodes(
        plan.hosts, command, timeout=30.0, connect_timeout=10.0,
        stdin=plan.node_private.encode(),
    )  # fmt: skip
    problems = [
        r.why if not r.ok else f"{r.node}: writing the job's settings failed (exit "
        f"{r.value.exit_code}): {r.value.stderr.decode(errors='replace').strip()[-200:]}"
        for r in results
        if not r.ok or r.value.exit_code != 0
    ]
    if problems:
        raise OrchError(
            "the job's settings could not be written on every node; nothing was started:\n  "
            + "\n  ".join(problems),
            "check SSH to those nodes with `orch doctor --hostfile F`",
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
