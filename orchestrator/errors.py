"""The project's own error types.

Every error orch raises on purpose is an OrchError: a one-line message that
names what is wrong (node, file, line) and a hint that says how to fix it. The
CLI turns these into one clear line; anything else is a bug and gets a traceback.
"""

from __future__ import annotations


class OrchError(Exception):
    """A failure the user can act on. Exit code 1 unless a subclass says otherwise."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(OrchError):
    """Bad input from the user: arguments, files, recipes. Exit code 2."""

    exit_code = 2


class InputFileError(UsageError):
    """A file the user gave does not parse: names the file and, when known, the line."""

    def __init__(
        self, path: str, message: str, line: int | None = None, hint: str | None = None
    ) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}", hint)
        self.path = path
        self.line = line


# orch's own failures before a job starts have codes of their own, from sysexits.h, which
# training scripts do not use: a script that exits 1 or 2 is never taken for orch.
class NodesUnavailable(OrchError):
    """The job's nodes cannot be reached or used before anything starts (SSH, too few
    nodes answering, a port, the job's settings, --sync, --push-env). Exit 69."""

    exit_code = 69  # EX_UNAVAILABLE


class RecordError(OrchError):
    """The job's record cannot be made: a runs directory not the user's alone, or one it
    cannot write. Exit 73."""

    exit_code = 73  # EX_CANTCREAT


class PreflightFailed(OrchError):
    """The pre-flight found what would break the job (a missing package, a different
    environment, a port in use). Exit 78."""

    exit_code = 78  # EX_CONFIG


class SandboxError(OrchError):
    """The loopback cluster could not be brought up or down."""


class RestartNotStarted(OrchError):
    """A restart could not start: the job ends with its last attempt, and its exit code."""

    def __init__(self, attempt: int, why: OrchError, exit_code: int) -> None:
        super().__init__(
            f"attempt {attempt + 1} could not start ({why}); the job ends with attempt "
            f"{attempt}'s exit code {exit_code}",
            why.hint,
        )
        self.exit_code = exit_code
