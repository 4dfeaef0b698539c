"""Slurm's client commands, for jobs that run in an allocation: cancel a step or a job,
read a job's state, requeue a batch job, submit a batch script, read each node's state and
the nodes Slurm took out (with why). Each is bounded by a timeout; none raises for an answer
Slurm gives (the caller gets it as a value)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.errors import OrchError
from orchestrator.specs.slurm import (
    SlurmJobView,
    parse_job_view,
    parse_kill_wait,
    slurm_end_left,
    slurm_time_left,
)

_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class SlurmAnswer:
    code: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def problem(self) -> str:
        lines = (self.err or self.out).strip().splitlines()
        return lines[-1] if lines else f"exit code {self.code}"


def _run(
    argv: Sequence[str], timeout: float = _TIMEOUT_S, env: Mapping[str, str] | None = None
) -> SlurmAnswer:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=None if env is None else dict(env), check=False)  # fmt: skip
    except FileNotFoundError:
        return SlurmAnswer(127, "", f"{argv[0]}: not installed on this machine")
    except subprocess.TimeoutExpired:
        return SlurmAnswer(124, "", f"{argv[0]} did not answer within {timeout:g}s")
    return SlurmAnswer(done.returncode, done.stdout, done.stderr)


def cancel(target: str) -> SlurmAnswer:
    """scancel a job (`123`) or a step (`123.4`)."""
    return _run(["scancel", "--quiet", target])


def job_state(slurm_job: str) -> str | None:
    """PENDING, RUNNING, COMPLETED, CANCELLED, FAILED...: squeue while Slurm holds the job,
    then `scontrol show job` (until MinJobAge), then sacct where accounting runs."""
    answer = _run(["squeue", "-h", "-j", slurm_job, "-o", "%T"])
    if answer.ok and answer.out.strip():
        return answer.out.split()[0]
    answer = _run(["scontrol", "show", "job", "-o", slurm_job])
    if answer.ok:
        for word in answer.out.split():
            if word.startswith("JobState="):
                return word.partition("=")[2]
    answer = _run(["sacct", "-n", "-X", "-P", "-j", slurm_job, "-o", "State"])
    if answer.ok and answer.out.strip():
        return answer.out.split()[0]
    return None


def job_view(slurm_job: str) -> SlurmJobView | None:
    """The job's state and restart count as the controller holds them (`scontrol show job`,
    until MinJobAge after its end); None when Slurm does not answer."""
    answer = _run(["scontrol", "show", "job", "-o", slurm_job])
    return parse_job_view(answer.out) if answer.ok else None


def requeue(slurm_job: str) -> SlurmAnswer:
    """`scontrol requeue`: the batch job back in the queue, its allocation ended."""
    return _run(["scontrol", "requeue", slurm_job])


def time_left(slurm_job: str) -> float | None:
    """Seconds the allocation has left (squeue's %L); None when it has no limit or Slurm
    does not say."""
    answer = _run(["squeue", "-h", "-j", slurm_job, "-o", "%L"])
    return slurm_time_left(answer.out.split()[0]) if answer.ok and answer.out.strip() else None


def end_left(slurm_job: str) -> float | None:
    """Seconds to the allocation's end as the controller holds it (squeue's %e), which moves
    forward when Slurm preempts the job with a grace; None when Slurm does not say, or the job
    is no longer RUNNING: a `scancel` or a requeue sets the end to that moment, and its
    SIGTERM to the head says the rest (KillWait)."""
    words = _run(["squeue", "-h", "-j", slurm_job, "-o", "%T %e"]).out.split()
    if len(words) != 2 or words[0] != "RUNNING":
        return None
    return slurm_end_left(words[1], time.time())


def kill_wait() -> float | None:
    """Slurm's KillWait (seconds from its SIGTERM to its SIGKILL as it ends a job); None
    when Slurm does not say."""
    answer = _run(["scontrol", "show", "config"])
    return parse_kill_wait(answer.out) if answer.ok else None


def submit_batch(script: str, cwd: str) -> str:
    """sbatch SCRIPT; the new Slurm job id. Refused: an OrchError in sbatch's words."""
    try:
        done = subprocess.run(["sbatch", "--parsable", script], capture_output=True, text=True,
                              timeout=60, check=False, cwd=cwd)  # fmt: skip
    except FileNotFoundError as err:
        raise OrchError("sbatch is not installed on this machine",
                        "run orch on a Slurm login node (slurm-client)") from err  # fmt: skip
    except subprocess.TimeoutExpired as err:
        raise OrchError("sbatch did not answer within 60s",
                        "check the controller: `scontrol ping`") from err  # fmt: skip
    if done.returncode != 0:
        raise OrchError(f"Slurm refused the batch job: {done.stderr.strip() or done.stdout}",
                        f"the script is {script}; check its #SBATCH lines")  # fmt: skip
    return done.stdout.strip().split(";")[0]


def node_problems(nodes: Sequence[str]) -> dict[str, str]:
    """The nodes of `nodes` Slurm has taken out (down, drained, failing), each with its
    state and reason, from one `sinfo -R`; {} when all are fine or Slurm does not answer."""
    answer = _run(["sinfo", "-R", "-h", "-N", "-o", "%N|%T|%E"])
    if not answer.ok:
        return {}
    wanted = set(nodes)
    found: dict[str, str] = {}
    for line in answer.out.splitlines():
        node, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        if node in wanted and node not in found:
            found[node] = f"{state.lower()} (reason: {reason})" if reason else state.lower()
    return found


def node_states(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each node's state as sinfo names it (idle, alloc, down, drain...); {} if no answer.
    `env`: where the client finds its config (SLURM_CONF), when not this process's."""
    answer = _run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10, env=env)
    if not answer.ok:
        return {}
    pairs = (line.split() for line in answer.out.splitlines())
    return {p[0]: p[1].rstrip("*~#!%$@^-") for p in pairs if len(p) == 2}
