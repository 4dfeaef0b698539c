"""Stopping a job's processes on this node: TERM, then KILL what is left after a grace
period. STANDARD LIBRARY ONLY (shipped inline).

The agent sweeps its node when the job's command ends (nothing of the job may outlive it)
or the head is gone; run as a program (`JOB_ID GRACE NODE`, plan/agent_command.py's
kill_command), it is `orch kill` and the head's teardown on each node it addresses. Either
way only this node's processes of the job (remote/procs.py): another node that shares the
kernel keeps its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

# Inside a Slurm step, Slurm's SIGTERM (a preemption, `scancel`) reaches every process of
# the step at once, the agent's among them: the head decides the stop of the whole job (the
# stop signal and the grace), so the agent tells it and goes on, and sweeps the node itself
# only when no stop has begun there this long after (the head is gone, or cannot reach it).
SLURM_STEP_VAR = "SLURM_STEP_ID"
HEAD_DECIDES_S = 15.0

try:  # shipped inline: loaded beside this program as orch_<name>
    import orch_procs as procs
except ImportError:
    from orchestrator.remote import procs


class SlurmTerm:
    """Slurm's first SIGTERM to an agent inside a step, left to the head to act on."""

    def __init__(self, environ: dict[str, str] | os._Environ[str]) -> None:
        self.in_step = SLURM_STEP_VAR in environ
        self.at: float | None = None  # when it came, on the monotonic clock
        self.said = False

    def take(self, signum: int, now: float) -> bool:
        """Whether `signum` is that SIGTERM (then kept for the head, not acted on here)."""
        if signum != signal.SIGTERM or not self.in_step or self.at is not None:
            return False
        self.at = now
        return True

    def to_say(self) -> bool:
        """True once, after the signal came: the head is to be told then."""
        if self.at is None or self.said:
            return False
        self.said = True
        return True

    def overdue(self, stop_begun: bool, now: float) -> bool:
        """No stop has begun on the node HEAD_DECIDES_S after the signal: sweep it."""
        return self.at is not None and not stop_begun and now - self.at > HEAD_DECIDES_S


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def stop_job(job_id: str, node: str, grace: float, proc: str = procs.PROC) -> dict[str, int]:
    """TERM every process of the job on this node, KILL what is left after `grace` seconds."""
    found = procs.job_pids(job_id, node, proc)
    signal_all(found, signal.SIGTERM)
    # A frozen process only sees TERM once it runs again.
    signal_all(found, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and procs.job_pids(job_id, node, proc):
        time.sleep(0.1)
    killed = 0
    # New processes may be forked while we stop the others: KILL until none is left.
    for _ in range(50):
        left = procs.job_pids(job_id, node, proc)
        if not left:
            break
        killed += len(left)
        signal_all(left, signal.SIGKILL)
        time.sleep(0.05)
    return {"found": len(found), "killed": killed, "left": len(procs.job_pids(job_id, node, proc))}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: sweep JOB_ID GRACE NODE", file=sys.stderr)
        return 2
    job_id, grace, node = argv[0], float(argv[1]), procs.node_name(argv[2])
    result = stop_job(job_id, node, grace)
    print(json.dumps(result), flush=True)
    return 0 if result["left"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
