"""The words a job's end is told in: its states, the kinds of failure, and the exit codes and
phrases the verdict, the records, the report, the restart policy and the CLI share.

Str enums whose members are the very words `job.json` holds. Pure.
"""

from __future__ import annotations

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
    HEAD_DIED = "head-died"  # never written: shown for a running record whose head is gone
