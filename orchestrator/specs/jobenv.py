"""The environment a job gets on every node, built fresh for each job.

Values never pass through a shell: they travel to every node in a user-only file
(see prepare/ready.py) and the agent sets them, so spaces, quotes, `$(...)` and newlines
reach the ranks unchanged and run nothing. Secret values are passed to the job but
redacted from anything saved or printed. Pure.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping

from orchestrator.errors import UsageError
from orchestrator.specs.constants import (
    CHECKPOINT_DIR_VAR,
    JOB_ID_VAR,
    LAUNCHER_SHUTDOWN_MARGIN_S,
    LAUNCHER_SHUTDOWN_VAR,
    RESTART_COUNT_VAR,
    STOP_GRACE_VAR,
    STOP_SIGNAL_VAR,
)
from orchestrator.specs.stop import StopSettings

REDACTED = "***"
# A name holding one of these is a secret's: HF_TOKEN, WANDB_API_KEY, PGPASSWORD.
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
# Words of a name (split at `_`) that make it a secret's on their own: DB_PASS.
_SECRET_WORDS = frozenset({"PASS", "PWD", "APIKEY"})
# Words that hold a marker and name no secret: TOKENIZERS_PARALLELISM (a switch).
_NOT_SECRET_WORDS = frozenset({"TOKENIZERS", "TOKENIZER"})
# Values that are credentials whatever their name: a provider's token prefix, a JWT, a URL
# with a password in it (postgres://user:pass@host).
_TOKEN_PREFIXES = re.compile(
    r"(hf_|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|sk-|sk_live_|rk_live_|xox[abprs]-|"
    r"AKIA|ASIA|AIza|ya29\.|eyJ)[A-Za-z0-9_\-.]{8,}"
)
_URL_PASSWORD = re.compile(r"://[^/\s:@]+:[^/\s@]+@")
# A long run of token characters: an API key in base64, hex or a UUID.
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9+/=_\-]{32,}")
_SEPARATORS = re.compile(r"[-_/]")
# Variables forwarded from the head without being asked for.
AUTO_PREFIXES = ("NCCL_",)

# What orch sets for each job, which neither the user nor the head's environment changes.
ORCH_SET = (JOB_ID_VAR, RESTART_COUNT_VAR, STOP_SIGNAL_VAR, STOP_GRACE_VAR, CHECKPOINT_DIR_VAR)

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def is_secret(name: str) -> bool:
    """True when the name says the value is a secret: it holds TOKEN, KEY, SECRET, PASSWORD,
    PASSWD or CREDENTIAL, or has a word PASS or PWD (TOKENIZERS_PARALLELISM does not)."""
    words = [word for word in name.upper().split("_") if word]
    if len(words) > 1 and any(word in _SECRET_WORDS for word in words):
        return True
    return any(marker in word for word in words if word not in _NOT_SECRET_WORDS
               for marker in SECRET_MARKERS)  # fmt: skip


def looks_like_token(value: str) -> bool:
    """True when a value reads as a credential whatever its name: a known token prefix
    (hf_, ghp_, sk-, AKIA...), a JWT, a URL with a password, or 32 or more characters of
    base64, hex or a UUID. Paths and ordinary words are no tokens."""
    if _URL_PASSWORD.search(value) or _TOKEN_PREFIXES.fullmatch(value):
        return True
    if not _TOKEN_LIKE.fullmatch(value) or value.startswith(("/", ".", "~")):
        return False
    has_letter = any(c.isalpha() for c in value)
    has_digit = any(c.isdigit() for c in value)
    # A long-name-with-dashes is words; a token has few separators for its length.
    return has_letter and has_digit and len(_SEPARATORS.findall(value)) * 8 <= len(value)


def is_secret_entry(name: str, value: str) -> bool:
    """A variable whose value is never shown: secret by its name or by its value."""
    return is_secret(name) or looks_like_token(value)


def redact(env: Mapping[str, str]) -> dict[str, str]:
    """A copy with every secret value (by name or by value) replaced by '***'."""
    return {name: REDACTED if is_secret_entry(name, value) else value
            for name, value in env.items()}  # fmt: skip


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
    checkpoint_dir: str | None = None,
) -> dict[str, str]:
    """The job's variables: ORCH_JOB_ID, ORCH_RESTART_COUNT, ORCH_STOP_SIGNAL,
    ORCH_STOP_GRACE and, given `checkpoint_dir`, ORCH_CHECKPOINT_DIR; the launchers' shutdown
    timeout past the grace; the head's NCCL_*, the passthrough names set, then extra.

    `extra` (a recipe's `env`, `--env` options) wins over the head's values, but
    may not change ORCH_JOB_ID (teardown finds the job's processes by it),
    ORCH_RESTART_COUNT (a script resumes by it), the stop's (orch sends that signal) nor
    ORCH_CHECKPOINT_DIR (orch copies and stages what is there).
    """
    if not job_id:
        raise UsageError("empty job id")
    stop = stop or StopSettings()
    env: dict[str, str] = {JOB_ID_VAR: job_id, RESTART_COUNT_VAR: str(restart_count),
                           STOP_SIGNAL_VAR: stop.signal, STOP_GRACE_VAR: f"{stop.grace:g}"}
    if checkpoint_dir is not None:
        env[CHECKPOINT_DIR_VAR] = checkpoint_dir
    env[LAUNCHER_SHUTDOWN_VAR] = str(math.ceil(stop.grace) + LAUNCHER_SHUTDOWN_MARGIN_S)
    for name in sorted(environ):
        if name.startswith(AUTO_PREFIXES):
            env[name] = environ[name]
    for name in passthrough:
        check_name(name)
        if name in environ and name not in ORCH_SET:
            env[name] = environ[name]
    for name, value in extra.items():
        if name in ORCH_SET and value != env.get(name):
            raise UsageError(
                f"{name} is set by orch for each job and cannot be overridden",
                hint=f"remove {name} from the job's env"
                + (" and give --checkpoint-dir PATH" if name == CHECKPOINT_DIR_VAR else ""),
            )
        env[name] = value
    for name, value in env.items():
        check_name(name)
        check_value(name, value)
    return env
