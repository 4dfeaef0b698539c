"""The job's nodes made ready, before anything of the job starts on them (`ready_nodes`):
--sync -> the job's private settings on every node, while node 0 picks the main port ->
pre-flight (with --push-env: the head's environment pushed where it differs, then the
pre-flight again).

Each step either passes or raises OrchError before anything of the job has started (and
then the private settings written so far are removed again); what a step found goes to
the caller's `PrepareReporter` (the CLI prints it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.checks.environment import PushFix
from orchestrator.checks.model import DoctorReport
from orchestrator.checks.request import PreflightRequest
from orchestrator.errors import (
    NodesUnavailable,
    PreflightFailed,
    UsageError,
)
from orchestrator.nodes.transport import SLURM, plan_transport
from orchestrator.pernode import GroupResult
from orchestrator.plan.agent_command import node_files_command
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.prepare.job import PipelineOptions
from orchestrator.prepare.push_env import (
    PushDone,
    environment_record,
    nodes_to_push,
    push_fix,
    push_to,
)
from orchestrator.prepare.sync import SyncedFiles
from orchestrator.records.job import EnvironmentRecord


class PrepareReporter(Protocol):
    """Hears what the steps before the job found."""

    def synced(self, plan: LaunchPlan, results: GroupResult[SyncedFiles]) -> None: ...

    def preflight_failed(self, report: DoctorReport) -> None: ...

    def pushing_environment(self, python: str, nodes: Sequence[str]) -> None: ...

    def environment_pushed(self, done: PushDone) -> None: ...


@dataclass(frozen=True)
class PreflightRun:
    """The pre-flight as it ran, for the job's page: it runs before the job's directory exists."""

    started: float
    ended: float
    report: DoctorReport


@dataclass(frozen=True)
class ReadyNodes:
    """The plan with the main port node 0 picked (when asked), its settings on every node;
    the pre-flight and what the record keeps of the nodes' environments (None: skipped)."""

    plan: LaunchPlan
    preflight: PreflightRun | None = None
    environment: EnvironmentRecord | None = None


def ready_nodes(plan: LaunchPlan, options: PipelineOptions, reporter: PrepareReporter,
                with_port: Callable[[], LaunchPlan] | None = None) -> ReadyNodes:  # fmt: skip
    """--sync, the job's settings on every node (with the port node 0 picks, when
    `with_port` is given), the pre-flight; OrchError, and the settings removed again, when
    the job cannot start."""
    if options.sync:
        _sync(plan, reporter)
    plan = _settings_and_port(plan, with_port)
    try:
        if not options.preflight:
            return ReadyNodes(plan)
        started = time.time()
        report, environment = _preflight(plan, options, reporter)
        return ReadyNodes(plan, PreflightRun(started, time.time(), report), environment)
    except BaseException:
        _remove_node_private(plan)
        raise


def _sync(plan: LaunchPlan, reporter: PrepareReporter) -> None:
    from orchestrator.prepare.sync import sync_workdir

    if plan.transport == SLURM:
        raise UsageError(
            "--sync copies the working directory over SSH, and the nodes are reached through "
            "Slurm only; nothing was started",
            "put the working directory on the cluster's shared filesystem, or leave --sync out",
        )

    results = sync_workdir(plan.hosts, os.getcwd(), plan.workdir)
    reporter.synced(plan, results)
    failed = [r.node for r in results.failed]
    if failed:
        raise NodesUnavailable(
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

    def command(node: str) -> str:
        return node_files_command(plan.python, "remove", plan.job_id, node, plan.job.node_root)

    plan_transport(plan).run(plan.hosts, command, timeout=10.0, connect_timeout=5.0)


def _write_node_private(plan: LaunchPlan) -> None:
    """The job's environment and the rank's command, on every node, readable by the user
    only, sent over ssh's own channel (stdin): never on a command line, on the head or a
    node. The agent checks its hash, takes it in, and removes it. On the node, a program of
    the standard library (remote/node_files.py) makes the node directory in the user's own
    directory there, level by level, private from the start and checked: a shell's `mkdir
    -p` took the login umask and followed whatever link another user had planted. Through
    Slurm, srun's stdin carries them as ssh's would."""

    def command(node: str) -> str:
        return node_files_command(plan.python, "write", plan.job_id, node, plan.job.node_root)

    results = plan_transport(plan).run(
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
        raise NodesUnavailable(
            "the job's settings could not be written on every node; nothing was started:\n  "
            + "\n  ".join(problems),
            "check SSH to those nodes with `orch doctor --hostfile F`",
        )


def _preflight(plan: LaunchPlan, options: PipelineOptions,
               reporter: PrepareReporter) -> tuple[DoctorReport, EnvironmentRecord]:  # fmt: skip
    """The pre-flight; with --push-env, first the head's environment pushed to the nodes
    where it found it differs, then the pre-flight again. Its report and what the job's
    record keeps of the nodes' environments; OrchError when the job cannot start."""
    fix = _push_fix(plan, options)
    report = _checked(plan, fix)
    pushed: PushDone | None = None
    differ = nodes_to_push(report) if options.push_env else ()
    if differ:
        reporter.pushing_environment(plan.python, differ)
        pushed = push_to(differ, plan.python, fix.command if fix is not None else None,
                         plan_transport(plan))  # fmt: skip
        reporter.environment_pushed(pushed)
        report = _checked(plan, fix)
    if report.ok:
        return report, environment_record(report, pushed)
    reporter.preflight_failed(report)
    raise PreflightFailed(
        f"pre-flight failed on {len({f.node for f in report.errors})} node(s); nothing was started",
        "fix the findings above (see `orch doctor --hostfile F`), or pass --no-doctor",
    )


def _push_fix(plan: LaunchPlan, options: PipelineOptions) -> PushFix | None:
    """How the findings say the head's environment reaches this job's nodes."""
    hosts = options.hosts
    in_allocation = hosts.hostfile is None and (hosts.slurm or bool(plan.job.slurm_job))
    hostfile = None if in_allocation else hosts.hostfile
    return push_fix(plan.python, hostfile=hostfile, slurm=in_allocation, include=hosts.include,
                    exclude=hosts.exclude, option=not options.push_env)  # fmt: skip


def _checked(plan: LaunchPlan, fix: PushFix | None) -> DoctorReport:
    from orchestrator.prepare.preflight import run_preflight

    request = PreflightRequest(plan.hostfile, python=plan.python, workdir=plan.workdir,
                               script=plan.job.script, main_port=plan.main_port, push=fix)
    return run_preflight(request, transport=plan_transport(plan))
