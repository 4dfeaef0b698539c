"""Tearing a job down on every node: the kill-by-job-id program, run through a fresh pdsh
so that it works even when the job's own channel is wedged. One result per node. And
`orch kill`'s protocol around it (`kill_job`): the head TERMed, the batch job cancelled, the
nodes told, the head waited for, the record closed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.nodes.pdsh import is_pdsh_own, run_pdsh, send_pdsh, ssh_exit_of
from orchestrator.nodes.slurm import cancel, job_state
from orchestrator.nodes.transport import SLURM, NodeTransport, reaching
from orchestrator.outcome.states import JobState
from orchestrator.pernode import GroupResult, NodeResult, failed, succeeded
from orchestrator.plan.agent_command import kill_command
from orchestrator.records.job import FINAL_STATES, KILL_MARKER, JobRecord, finished, head_alive
from orchestrator.records.ownership import check_job, check_runs_root
from orchestrator.records.rundir import RunDir
from orchestrator.remote.procs import SLURM_NODE
from orchestrator.specs.slurm import ACTIVE_STATES
from orchestrator.specs.words import StrEnum


class StopProblem(StrEnum):
    """Why the teardown has no report from a node (a NodeResult's kind)."""

    UNREACHABLE = "unreachable"  # not reached at all: not worth a second try
    NO_ANSWER = "no-answer"  # reached, or asked in the background, and never answered
    KILL_FAILED = "kill-failed"  # the kill program ran and failed


@dataclass(frozen=True)
class StopReport:
    """What the kill program found on a node: the job's processes, those it had to KILL
    after the grace period, and those still there."""

    found: int
    killed: int
    left: int

    def __str__(self) -> str:
        text = f"stopped {self.found} process(es), {self.killed} with KILL"
        return text + (f", {self.left} still running" if self.left else "")


def unreached(found: GroupResult[StopReport] | None) -> set[str]:
    """The nodes a teardown could not reach or that did not answer it (none: no teardown)."""
    gone = (StopProblem.UNREACHABLE, StopProblem.NO_ANSWER)
    return {r.node for r in (found or ()) if r.kind in gone}


def teardown_job(
    hosts: Sequence[str],
    job_id: str,
    python: str,
    *,
    grace: float,
    timeout: float,
    not_answering: Sequence[str] = (),
    log: Path | None = None,
    transport: NodeTransport | None = None,
) -> GroupResult[StopReport]:
    """Run the kill-by-job-id program on every host; what each one found (or why not).

    Hosts in `not_answering` (a node that stopped answering) get the stop request too, but
    nobody waits for them: pdsh goes on by itself, writing to `log`. Where the nodes are
    reached through Slurm, each host's program is its own srun step."""
    command = kill_command(python, job_id, grace)
    timeout = max(timeout, grace + 5)
    waited = [h for h in hosts if h not in not_answering]
    sent = [h for h in hosts if h in not_answering]
    if transport is not None and transport.kind == SLURM:
        command = kill_command(python, job_id, grace, node=SLURM_NODE)
        return _teardown_through(transport, hosts, sent, command, timeout)
    if sent and log is not None:
        send_pdsh(sent, command, timeout=timeout, log=log)
    found = {h: _not_waited_for(h, log) for h in sent}
    if waited:
        run = run_pdsh(waited, command, timeout=timeout)
        found.update((r.node, r) for r in stop_results(waited, run.output, timed_out=run.timed_out))
    return GroupResult(tuple(found[h] for h in hosts))


def _teardown_through(transport: NodeTransport, hosts: Sequence[str], sent: Sequence[str],
                      command: str, timeout: float) -> GroupResult[StopReport]:  # fmt: skip
    """The kill program as srun steps: the hosts that stopped answering are asked in the
    background (their steps end with Slurm's own timeouts), the others waited for."""
    if sent:
        threading.Thread(target=transport.run, args=(list(sent), command),
                         kwargs={"timeout": timeout}, daemon=True).start()  # fmt: skip
    waited = [h for h in hosts if h not in sent]
    answers = {r.node: r for r in transport.run(waited, command, timeout=timeout)}
    found = {h: _not_waited_for(h, None) for h in sent}
    for host in waited:
        answer = answers[host]
        lines = answer.value.stdout.decode(errors="replace").splitlines() if answer.value else []
        report = next(filter(None, map(_stop_report, reversed(lines))), None)
        if report is not None:
            found[host] = succeeded(host, report)
        elif answer.value is None:
            found[host] = failed(host, answer.problem or f"{host}: no answer", _STOPS_ITSELF,
                                 StopProblem.UNREACHABLE)  # fmt: skip
        else:
            found[host] = failed(host, f"{host}: kill failed (exit {answer.value.exit_code})",
                                 "run `orch kill` again", StopProblem.KILL_FAILED)  # fmt: skip
    return GroupResult(tuple(found[h] for h in hosts))


def _not_waited_for(host: str, log: Path | None) -> NodeResult[StopReport]:
    where = f"; pdsh's answer goes to {log}" if log is not None else ""
    return failed(host, f"{host}: stopped answering; stop request sent, not waited for{where}",
                  _STOPS_ITSELF, StopProblem.NO_ANSWER)  # fmt: skip


def stop_results(
    hosts: Sequence[str], output: Sequence[tuple[str, str]], *, timed_out: bool
) -> GroupResult[StopReport]:
    """Each host's result from pdsh's output of the kill program: (source, line) pairs as
    run_pdsh splits them."""
    found: dict[str, NodeResult[StopReport]] = {}
    for node, line in output:
        if node in hosts and node not in found:
            report = _stop_report(line)
            if report is not None:
                found[node] = succeeded(node, report)
        elif is_pdsh_own(node):
            lost = ssh_exit_of(line)
            if lost is not None and lost[0] in hosts and lost[0] not in found:
                found[lost[0]] = _ssh_failure(*lost)
    for host in hosts:
        if host not in found:
            why = "no answer (timed out)" if timed_out else "no answer"
            found[host] = failed(host, f"{host}: {why}", _STOPS_ITSELF, StopProblem.NO_ANSWER)
    return GroupResult(tuple(found[h] for h in hosts))


_STOPS_ITSELF = "its agent stops the job by itself once it notices the head is gone"


def _stop_report(line: str) -> StopReport | None:
    try:
        doc = json.loads(line)
        return StopReport(int(doc["found"]), int(doc["killed"]), int(doc["left"]))
    except (ValueError, KeyError, TypeError):
        return None


def _ssh_failure(node: str, code: int) -> NodeResult[StopReport]:
    if code == 255:
        return failed(node, f"{node}: unreachable (ssh exit 255)", _STOPS_ITSELF,
                      StopProblem.UNREACHABLE)  # fmt: skip
    return failed(
        node, f"{node}: kill failed (exit {code})",
        f"run `orch kill` again; if it fails again, check that {node} has a working python3 "
        f"(`ssh {node} python3 -V`)", StopProblem.KILL_FAILED,
    )  # fmt: skip


@dataclass(frozen=True)
class KillOutcome:
    record: JobRecord  # as it stands after the kill
    ok: bool  # every node answered and Slurm holds nothing of the job any more


def kill_job(run: RunDir, *, grace: float, say: Callable[[str], None]) -> KillOutcome:
    """`orch kill`: stop a job from any terminal. The head (if alive) is TERMed and reports
    the job killed; a batch job is cancelled; whatever the head does, every node is told by
    job id (TERM, `grace`, KILL). `say` gets each step's result as it comes. A record that is
    not the user's own is refused first: it names the interpreter run on every host it lists."""
    check_runs_root(run.path.parent)
    check_job(run)
    record = run.load()
    alive = head_alive(record)
    batch = record.slurm_batch and record.slurm_job_id is not None
    if alive or batch:
        run.touch(KILL_MARKER)
    if batch:
        # The batch job is the job's own: Slurm signals orch inside it, which tears the job
        # down, and ends the allocation.
        answer = cancel(str(record.slurm_job_id))
        say(f"Slurm job {record.slurm_job_id}: {'cancelled' if answer.ok else answer.problem}")
    if alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(record.head_pid, signal.SIGTERM)
    ok = True
    if record.hosts:
        transport = reaching(record.transport, record.slurm_job_id)
        outcome = teardown_job(record.hosts, record.id, record.python, grace=grace,
                               timeout=grace + 15, transport=transport)  # fmt: skip
        ok = outcome.ok
        for stopped in outcome:
            say(f"{stopped.node}: {stopped.value or stopped.why}")
    if record.transport == SLURM and record.slurm_step and not batch:
        # The job's own step, whatever its agents did: Slurm ends what is left of it.
        answer = cancel(record.slurm_step)
        say(f"Slurm step {record.slurm_step}: {'cancelled' if answer.ok else answer.problem}")
    deadline = time.monotonic() + grace + 30
    while (head_alive(record) or (batch and _slurm_active(record))) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    if batch and _slurm_active(record):
        say(f"Slurm job {record.slurm_job_id} still runs")
        ok = False
    record = run.load()
    if record.state not in FINAL_STATES:
        # The head is gone (or never answered): record the kill ourselves.
        run.touch(KILL_MARKER)
        record = finished(record, state=JobState.KILLED, exit_code=128 + signal.SIGTERM)
        run.save(record)
    return KillOutcome(record, ok)


def _slurm_active(record: JobRecord) -> bool:
    return job_state(str(record.slurm_job_id)) in ACTIVE_STATES
