"""The words a job's end is told in: its states, the kinds of failure, the failure itself,
and the exit codes and phrases the verdict, the records, the report, the restart policy
and the CLI share.

Str enums whose members are the very words `job.json` holds. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.specs.words import StrEnum

SSH_LOST = 255  # ssh's own exit code when the connection fails
# A node's ssh ended with another code before its agent ran (no such interpreter, say): the
# node answered, the command did not run there.
REMOTE_COMMAND_FAILED = "the remote command failed with exit code"
HANG_EXIT_CODE = 124  # a job that hung, as `timeout` reports a command that ran too long


class FailureKind(StrEnum):
    RANK = "rank"  # a rank (or its node's launcher) exited non-zero
    SILENT = "silent"  # a node stopped answering, or never started
    LOST = "lost"  # a node's ssh ended, or Slurm took it out, before it reported its exit
    HANG = "hang"  # no rank wrote anything for hang_timeout
    HEAD = "head"  # the head launcher failed, or srun refused the step
    SIGNAL = "signal"  # SIGINT or SIGTERM on the head
    KILLED = "killed"  # `orch kill`
    STOPPED = "stopped"  # a stop (Ctrl-C, `orch stop`, the time limit) whose grace ran out


class StopCause(StrEnum):
    """What asked the job to stop (and save): job.json's `stop.cause`."""

    CTRL_C = "ctrl-c"  # the first Ctrl-C on the head
    ORCH_STOP = "orch-stop"  # `orch stop JOB`, from any terminal
    TIME_LIMIT = "time-limit"  # --time-limit ran out
    SLURM_LIMIT = "slurm-time-limit"  # the allocation's end is near (its grace before it)
    SLURM_SIGNAL = "slurm-signal"  # Slurm's warning (--signal) or a preemption's SIGTERM

    @property
    def said(self) -> str:
        """`stopped by Ctrl-C`'s words for it."""
        return _STOP_WORDS[self]

    @property
    def exit_code(self) -> int:
        """The job's exit code after a stop: 130 as a shell's Ctrl-C, 143 as a TERM (and as
        `orch kill`), 124 as `timeout` reports a command that ran out of time."""
        return _STOP_CODES[self]


_STOP_WORDS = {StopCause.CTRL_C: "Ctrl-C", StopCause.ORCH_STOP: "`orch stop`",
               StopCause.TIME_LIMIT: "the time limit",
               StopCause.SLURM_LIMIT: "the Slurm allocation's time limit",
               StopCause.SLURM_SIGNAL: "Slurm (its warning, or a preemption)"}  # fmt: skip
_STOP_CODES = {StopCause.CTRL_C: 130, StopCause.ORCH_STOP: 143, StopCause.TIME_LIMIT: 124,
               StopCause.SLURM_LIMIT: 124, StopCause.SLURM_SIGNAL: 143}  # fmt: skip


class JobState(StrEnum):
    """A job's state, as its record holds it (records/job.py)."""

    QUEUED = "queued"  # submitted with --sbatch, not started yet
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"  # by `orch stop` or the time limit (a Ctrl-C's stop: interrupted)
    HEAD_DIED = "head-died"  # never written: shown for a running record whose head is gone


@dataclass(frozen=True)
class Failure:
    """What ended a job first, as the verdict found it."""

    node: str  # "" for the head itself
    reason: str
    exit_code: int
    rank: int | None = None
    kind: FailureKind = FailureKind.RANK
    when: float = 0.0  # the agent's failed_at, or when the report arrived (wall clock)
