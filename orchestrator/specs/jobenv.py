"""The environment a job gets on every node, built fresh for each job.

Values never pass through a shell: they travel to every node in a user-only file
(see prepare/ready.py) and the agent sets them, so spaces, quotes, `$(...)` and newlines
reach the ranks unchanged and run nothing. Secret values are passed to the job but
redacted from anything saved or printed. Pure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from orchestrator.errors import UsageError
from orchestrator.specs.constants import (
    JOB_ID_VAR,
    RESTART_COUNT_VAR,
    STOP_GRACE_VAR,
    STOP_SIGNAL_VAR,
)
from orchestrator.specs.stop import StopSettings

REDACTED = "***"
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
# Variables forwarded from the head without being asked for.
AUTO_PREFIXES = ("NCCL_",)

# What orch sets for each job, which neither the user nor the head's environment changes.
ORCH_SET = (JOB_ID_VAR, RESTART_COUNT_VAR, STOP_SIGNAL_VAR, STOP_GRACE_VAR)

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def is_secret(name: str) -> bool:
    """True when the name says the value is a secret (TOKEN, KEY, SECRET, PASSWORD)."""
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def redact(env: Mapping[str, str]) -> dict[str, str]:
    """A copy with every secret value replaced by '***'."""
    return {name: REDACTED if is_secret(name) else value for name, value in env.items()}


def check_name(name: str) -> None:
    """Raise UsageError unless `name` is a valid environment variable name."""
    if _NAME_RE.fullmatch(name) is None:
        raise UsageError(
            f"invalid environment variable name {name!r}",
            hint="names are letters, digits and '_', not starting with a digit",
        )


def check_value(name: str, value: str) -> None:
    """Raise UsageError when `value` cannot be passed through an environment."""
    if not isinstance(value, str):
        kind = type(value).__name__
        raise UsageError(f"environment variable {name}: value must be text, not {kind}")
    if "\0" in value:
        raise UsageError(
            f"environment variable {name}: value contains a NUL byte",
            hint="environment values cannot contain NUL; remove it",
        )


def build_job_env(
    job_id: str,
    extra: Mapping[str, str],
    passthrough: Iterable[str] = (),
    environ: Mapping[str, str] = os.environ,
    restart_count: int = 0,
    stop: StopSettings | None = None,
) -> dict[str, str]:
    """The job's variables: ORCH_JOB_ID, ORCH_RESTART_COUNT, ORCH_STOP_SIGNAL and
    ORCH_STOP_GRACE, the head's NCCL_*, the passthrough names set, then extra.

    `extra` (a recipe's `env`, `--env` options) wins over the head's values, but
    may not change ORCH_JOB_ID (teardown finds the job's processes by it),
    ORCH_RESTART_COUNT (a script resumes by it) nor the stop's (orch sends that signal).
    """
    if not job_id:
        raise UsageError("empty job id")
    stop = stop or StopSettings()
    env: dict[str, str] = {JOB_ID_VAR: job_id, RESTART_COUNT_VAR: str(restart_count),
                           STOP_SIGNAL_VAR: stop.signal, STOP_GRACE_VAR: f"{stop.grace:g}"}
    for name in sorted(environ):
        if name.startswith(AUTO_PREFIXES):
            env[name] = environ[name]
    for name in passthrough:
        check_name(name)
        if name in environ and name not in ORCH_SET:
            env[name] = environ[name]
    for name, value in extra.items():
        if name in ORCH_SET and value != env[name]:
            raise UsageError(
                f"{name} is set by orch for each job and cannot be overridden",
                hint=f"remove {name} from the job's env",
            )
        env[name] = value
    for name, value in env.items():
        check_name(name)
        check_value(name, value)
    return env
