"""Script arguments that look like secrets (`--hf_token hf_abc`, `--db-password=...`).

A rank's argv is in /proc/<pid>/cmdline for the whole job, readable by every user of the
node: a secret belongs in the job's environment (`--env NAME` forwards the head's value, a
recipe's `passthrough_env` too), which travels in a file only the user can read. The launch
warns; this module only decides, on values. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# Words of an option's name that make its value a secret: `--hf_token`, `--api-key`.
_SECRET_WORDS = frozenset({"token", "password", "passwd", "secret", "key", "apikey"})
# Endings that do too, glued to another word: `--hftoken`, `--dbpassword`.
_SECRET_ENDINGS = ("token", "password", "passwd", "secret", "apikey")
# A tokenizer's special tokens are no secrets: `--pad_token 0`, `--eos-token </s>`.
_TOKEN_KINDS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special"})
# A value that is a switch's, not a secret's: `--use_auth_token true`.
_SWITCH_VALUES = frozenset({"true", "false", "yes", "no", "on", "off", "none", "0", "1", ""})
_WORD_SPLIT = re.compile(r"[-_.]+")


@dataclass(frozen=True)
class SecretArg:
    """One option whose value looks like a secret: its name as typed (`--hf_token`) and the
    environment variable its value could travel in instead (`HF_TOKEN`)."""

    option: str
    variable: str


def looks_secret(option: str) -> bool:
    """Whether an option's name (`--hf_token`, without a value) names a secret."""
    words = [w for w in _WORD_SPLIT.split(option.lstrip("-").lower()) if w]
    for at, word in enumerate(words):
        if word in ("token", "tokens") and at > 0 and words[at - 1] in _TOKEN_KINDS:
            continue
        if word in _SECRET_WORDS or (word.endswith(_SECRET_ENDINGS) and word != "tokens"):
            return True
    return False


def _variable(option: str) -> str:
    name = re.sub(r"[^A-Za-z0-9]+", "_", option.lstrip("-")).strip("_").upper()
    return name if name and not name[0].isdigit() else f"ARG_{name}"


def _option_value(args: Sequence[str], at: int) -> tuple[str, str] | None:
    """(option, value) when args[at] is an option given a value, in `--x=v` or `--x v` form."""
    word = args[at]
    if not word.startswith("-") or word in ("-", "--"):
        return None
    name, eq, value = word.partition("=")
    if eq:
        return name, value
    following = args[at + 1] if at + 1 < len(args) else None
    if following is None or following.startswith("-"):
        return None  # a switch, or the next option
    return name, following


def secret_args(args: Sequence[str]) -> tuple[SecretArg, ...]:
    """Each option of the script's arguments that is given a value and names a secret,
    once, in order. A `--` ends the options, as it does for most scripts."""
    found: dict[str, SecretArg] = {}
    for at, word in enumerate(args):
        if word == "--":
            break
        given = _option_value(args, at)
        if given is None:
            continue
        option, value = given
        if value.strip().lower() in _SWITCH_VALUES or not looks_secret(option):
            continue
        found.setdefault(option, SecretArg(option, _variable(option)))
    return tuple(found.values())
