"""Tearing a job down on every node: the kill-by-job-id program, run through a fresh pdsh
so that it works even when the job's own channel is wedged."""

from __future__ import annotations

from orchestrator.plan.agent_command import kill_command
from orchestrator.run.pdsh import run_pdsh, ssh_exit_of

# `orch kill` leaves this file in the run directory, so the head reports "killed".
KILL_MARKER = "kill-requested"


def teardown_job(
    hosts: tuple[str, ...] | list[str], job_id: str, python: str, *, grace: float, timeout: float
) -> dict[str, str]:
    """Run the kill-by-job-id program on every host; what each one said (or why not)."""
    run = run_pdsh(
        list(hosts), kill_command(python, job_id, grace), timeout=max(timeout, grace + 5)
    )
    outcome: dict[str, str] = {}
    for node, line in run.output:
        if node in hosts and line.startswith("{"):
            outcome[node] = line
        elif node == "":
            lost = ssh_exit_of(line.split(": ", 1)[-1])
            if lost is not None and lost[0] in hosts:
                node_name, code = lost
                why = f"kill failed (exit {code})"
                outcome.setdefault(node_name, "unreachable" if code == 255 else why)
    for host in hosts:
        outcome.setdefault(host, "no answer (timed out)" if run.timed_out else "no answer")
    return outcome
