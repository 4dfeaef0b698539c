"""What a job run prints on the head: the steps before it, each attempt's start and end, and
the summary at its end (the failure, its root cause, the stacks kept, the attempts)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from orchestrator.checks.model import DoctorReport
from orchestrator.cli.documents import err_console
from orchestrator.cli.jobs.record_shown import (
    cause_text,
    print_attempts,
    print_cause_notes,
    print_requeue,
    print_root_cause,
)
from orchestrator.logs.router import LogView
from orchestrator.logs.view import LiveView
from orchestrator.outcome.states import FailureKind, JobState
from orchestrator.pernode import GroupResult
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.prepare.push_env import PushDone
from orchestrator.prepare.sync import SyncedFiles
from orchestrator.records.job import (
    AttemptRecord,
)
from orchestrator.records.rundir import RunDir
from orchestrator.report import write_report
from orchestrator.run.launch import LaunchResult
from orchestrator.specs.constants import RESTART_COUNT_VAR
from orchestrator.specs.inventory import nodes_text
from orchestrator.specs.units import format_bytes
from orchestrator.stacks.fold import StackBlock, rank_ranges, user_frame


def _majority_place(block: StackBlock) -> str:
    """Where most ranks stood: their innermost frame of the user's code, and the call
    they were inside (the collective they waited in)."""
    plural = "ranks" if len(block.ranks) > 1 else "rank"
    ranks = f"{plural} {rank_ranges(block.rank_numbers)}"
    frame = user_frame(block.ranks[0])
    inner = block.threads[0].frames[0].function if block.threads and block.threads[0].frames else ""
    where = frame.where if frame else "(no frame of your code)"
    inside = f", inside {inner}" if inner and (frame is None or inner != frame.function) else ""
    together = " stood together" if len(block.ranks) > 1 else " stood"
    return f"{ranks}{together} at {where}{inside}"


def print_stacks_kept(result: LaunchResult) -> None:
    """Where the ranks still running stood when the job was torn down."""
    err = err_console()
    if result.stacks_problem is not None:
        err.print(f"[yellow]{escape(result.stacks_problem)}[/]")
    if result.stacks_file is None or result.stacks is None:
        return
    folded = result.stacks.folded
    if not result.stacks.ranks:
        err.print("no rank was still running when the job was torn down")
        return
    err.print("where the ranks still running stood before the teardown:")
    for outlier in folded.outliers if folded is not None else ():
        where = outlier.frame.where if outlier.frame else "(no frame of your code)"
        err.print(f"  rank {outlier.rank} on {outlier.node} stood apart at {where}", markup=False)
    if folded is not None and folded.majority is not None:
        err.print(f"  {_majority_place(folded.majority)}", markup=False)
    err.print(f"every running rank's stack: {result.stacks_file}", markup=False)


def _print_recovery(console: Console, attempts: tuple[AttemptRecord, ...]) -> None:
    """Why the last attempt was not followed by another, when restarts were asked for."""
    last = attempts[-1] if attempts else None
    if last is None or last.cause is None:
        return
    console.print(f"recovery: {last.cause['decision']}", markup=False)


def print_summary(result: LaunchResult, *, restarts: bool = False) -> None:
    err = err_console()
    print_attempts(err, result.attempts)
    codes = ", ".join(
        f"{node}={'-' if code is None else code}" for node, code in result.node_exit_codes.items()
    )
    if result.state == JobState.SUCCEEDED:
        err.print(f"[green]job {result.job_id} succeeded[/] (nodes: {codes})")
        print_requeue(err, result.requeue)
    else:
        failure = result.first_failure
        err.print(f"[red]job {result.job_id} {result.state}[/], exit code {result.exit_code}")
        for line in result.stop.lines() if result.stop is not None else ():
            err.print(line, markup=False)
        # A stop's own failure is its summary above; a node lost meanwhile is said too.
        if failure is not None and (result.stop is None or failure.kind != FailureKind.STOPPED):
            print_root_cause(err, failure)
            rank = f" rank {failure.rank}" if failure.rank is not None else ""
            err.print(f"first failure: {failure.node}{rank}: {failure.reason}", markup=False)
            print_cause_notes(err, failure)
            if failure.last_lines and not failure.traceback:
                err.print(f"last lines from {failure.node}:")
                for line in failure.last_lines:
                    err.print(f"  | {line}", markup=False)
        err.print(f"node exit codes: {codes}")
        if restarts:
            _print_recovery(err, result.attempts)
        print_requeue(err, result.requeue)
        print_stacks_kept(result)
        for failed in result.teardown.failed if result.teardown else ():
            err.print(f"[yellow]teardown on {failed.node}[/]: {escape(failed.why)}")
    for node, problem in result.node_logs.items():
        if problem != "ok":
            err.print(f"[yellow]raw logs of {node} not collected[/]: {problem}")
    err.print(f"record: {result.run_dir}")
    print_report(err, result.run_dir)


def print_report(err: Console, run_dir: Path, state: JobState | None = None) -> None:
    """The job's page, written as it ends (`state`: an attempt's, as write_report takes it).
    Whatever goes wrong there is one line: the job's own outcome and exit code are what
    matter."""
    try:
        path = write_report(run_dir, state)
    except Exception as problem:  # whatever it is, the job's end stands: one line, no traceback
        why = str(problem) or type(problem).__name__
        err.print(f"[yellow]report not written[/]: {escape(why)}")
        return
    err.print(f"report: {path}", markup=False)


class PipelinePrinter:
    """Prints what the steps before the job found (orchestrator.prepare.ready), and between
    attempts which one runs next on the live view."""

    def __init__(self, view: LogView | None = None) -> None:
        self.view = view

    def synced(self, plan: LaunchPlan, results: GroupResult[SyncedFiles]) -> None:
        err = err_console()
        for r in results:
            done = r.value
            if done is None:
                err.print(f"[red]sync {r.node}[/]: {escape(r.why)}")
            elif done.shared:
                err.print(f"sync {r.node}: shares {plan.workdir} with the head, nothing to copy")
            else:
                err.print(f"sync {r.node}: {done.sent} files copied, {done.unchanged} unchanged")

    def preflight_failed(self, report: DoctorReport) -> None:
        err = err_console()
        for finding in report.errors:
            err.print(f"[red]{finding.node}[/]: {finding.problem}\n  fix: {finding.fix}")

    def pushing_environment(self, python: str, nodes: Sequence[str]) -> None:
        err_console().print(f"--push-env: the environment of {python} differs from the head's on "
                     f"{nodes_text(nodes)}: pushing the head's there", markup=False)  # fmt: skip

    def environment_pushed(self, done: PushDone) -> None:
        err_console().print(
                     f"--push-env: pushed {done.root} (fingerprint {done.fingerprint[:8]}) to "
                     f"{len(done.nodes)} node(s): {format_bytes(done.sent_bytes)} sent in "
                     f"{done.seconds:.0f} s; checking again", markup=False)  # fmt: skip

    def started(self, plan: LaunchPlan, run: RunDir) -> None:
        restart = plan.job.env.get(RESTART_COUNT_VAR, "0")
        attempt = f" attempt {int(restart) + 1}" if restart != "0" else ""
        err_console().print(
            f"job {plan.job_id}{attempt}: {plan.launcher} on {plan.shape_text}; record {run.path}"
        )

    def attempt_ended(self, run_dir: Path, state: JobState) -> None:
        """The ended attempt's page, before its files move to attempts/<n>/."""
        print_report(err_console(), run_dir, state)

    def restarting(self, ended: AttemptRecord, plan: LaunchPlan, following: LaunchPlan,
                   pause: float) -> None:  # fmt: skip
        err = err_console()
        err.print(f"[yellow]attempt {ended.number} ended[/], exit code {ended.exit_code}: "
                  f"{escape(cause_text(ended))}")  # fmt: skip
        if ended.excluded:
            err.print(f"  dropped: {', '.join(ended.excluded)}", markup=False)
        nodes = ", ".join(following.hosts)
        err.print(f"attempt {ended.number + 1} in {pause:.0f} s on {nodes}", markup=False)
        if isinstance(self.view, LiveView):
            last = f"attempt {ended.number} ended, exit {ended.exit_code}: {cause_text(ended)}"
            self.view.new_attempt(following.hosts, f"attempt {ended.number + 1} ({last})")
        if following.world_size != plan.world_size:
            change = f"{plan.world_size} to {following.world_size} ranks"
            err.print(f"  the world size changes from {change} ({following.shape_text})",
                      markup=False)  # fmt: skip


    def checkpoints(self, line: str) -> None:
        """What became of the job's checkpoints: a shared directory, a copy that failed, what
        a restart resumes from."""
        if line:
            err_console().print(line, markup=False)

    def slurm_limit(self, left: float, stop_after: float, grace: float) -> None:
        """Inside an allocation with an end: when the job will be stopped to save."""
        if stop_after > 0:
            err_console().print(
                         f"the Slurm allocation ends in {left:.0f} s: the ranks are asked to "
                         f"save after {stop_after:.0f} s, their grace of {grace:g} s ending "
                         "before it", markup=False)  # fmt: skip
            return
        err_console().print(f"[yellow]warning[/]: the Slurm allocation ends in {left:.0f} s, less "
                     f"than the ranks' grace of {grace:g} s and the teardown: they are asked "
                     "to save at once; ask for more time (sbatch --time) or give "
                     "--stop-grace less")  # fmt: skip
