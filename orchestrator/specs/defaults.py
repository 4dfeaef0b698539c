"""Defaults for what a user types every time: the hostfile, the launcher, the interpreter,
the runs directory.

They come from, first to last: ORCH_HOSTFILE, a project's `orch.toml` (in the working
directory), the user's `$XDG_CONFIG_HOME/orch/config.toml` (`~/.config/orch/config.toml`),
each one under the command line's own options (and a recipe's values). A file holds top-level
keys only:

    hostfile = "hostfile"          # relative to the file's own directory
    launcher = "torchrun"          # pdsh, standard, torchrun (or deepspeed, accelerate)
    python = "/opt/venv/bin/python"
    runs_dir = "runs"              # the job records (ORCH_RUNS_DIR goes before it)

Pure: the CLI reads the files and the environment and hands their text here; each value
keeps where it came from (`Setting.source`), which a dry run shows."""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import InputFileError, UsageError
from orchestrator.specs.options import launcher_named

HOSTFILE_VAR = "ORCH_HOSTFILE"
PROJECT_FILE = "orch.toml"
USER_FILE = Path("orch") / "config.toml"  # under $XDG_CONFIG_HOME, else ~/.config
KEYS = ("hostfile", "launcher", "python", "runs_dir")
_TOML_LINE = re.compile(r"at line (\d+)")


@dataclass(frozen=True)
class Setting:
    """A default's value and where it came from: `ORCH_HOSTFILE`, or `FILE:LINE`."""

    value: str
    source: str


@dataclass(frozen=True)
class Defaults:
    """The defaults in force (None: none given anywhere)."""

    hostfile: Setting | None = None
    launcher: Setting | None = None
    python: Setting | None = None
    runs_dir: Setting | None = None


def user_file(environ: Mapping[str, str], home: Path) -> Path:
    """The user's defaults file: under $XDG_CONFIG_HOME when set (an absolute path, as the
    XDG spec asks), else ~/.config."""
    config = environ.get("XDG_CONFIG_HOME", "")
    base = Path(config) if os.path.isabs(config) else home / ".config"
    return base / USER_FILE


def _line_of(text: str, key: str) -> int | None:
    # `key = ...`, or a table `[key]` (a file of defaults has none).
    name = rf"[\"']?{re.escape(key)}[\"']?"
    pattern = re.compile(rf"^[ \t]*(?:{name}[ \t]*=|\[+[ \t]*{name}[ \t]*\])", re.M)
    match = pattern.search(text)
    return text.count("\n", 0, match.start()) + 1 if match else None


def _value(key: str, raw: object, path: Path) -> str:
    """The key's value as orch uses it (a UsageError says what is wrong with it)."""
    if not isinstance(raw, str) or not raw.strip():
        raise UsageError(f"'{key}' is {raw!r}, not a string", f'write it as {key} = "..."')
    if key == "launcher":
        return launcher_named(raw)
    if key in ("hostfile", "runs_dir"):
        return str(path.parent / Path(raw).expanduser())  # as written, from the file's place
    return str(Path(raw).expanduser()) if raw.startswith("~") else raw


def parse_defaults(text: str, path: Path) -> dict[str, Setting]:
    """The defaults a file's text gives, each with its `FILE:LINE`. A file that does not
    parse, a key orch does not know and a bad value are errors that name the file and line
    and say the fix."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        found = _TOML_LINE.search(str(err))
        raise InputFileError(str(path), f"not TOML: {err}",
                             int(found.group(1)) if found else None,
                             'each default is one line: key = "value"') from None  # fmt: skip
    settings = {}
    for key, raw in data.items():
        line = _line_of(text, key)
        if key not in KEYS:
            near = difflib.get_close_matches(key, KEYS, n=1)
            guess = f"did you mean {near[0]!r}? " if near else ""
            raise InputFileError(str(path), f"unknown key {key!r}", line,
                                 f"{guess}the keys: {', '.join(KEYS)}")  # fmt: skip
        try:
            value = _value(key, raw, path)
        except UsageError as err:
            raise InputFileError(str(path), err.message, line, err.hint) from None
        settings[key] = Setting(value, f"{path}:{line}" if line else str(path))
    return settings


def environment_defaults(environ: Mapping[str, str], cwd: Path) -> dict[str, Setting]:
    """What the environment gives: ORCH_HOSTFILE (relative to the working directory)."""
    hostfile = environ.get(HOSTFILE_VAR, "")
    if not hostfile:
        return {}
    return {"hostfile": Setting(str(cwd / Path(hostfile).expanduser()), HOSTFILE_VAR)}


def merged(layers: Sequence[Mapping[str, Setting]]) -> Defaults:
    """The defaults of `layers`, first layer first: the first that gives a key wins."""
    chosen: dict[str, Setting] = {}
    for layer in layers:
        for key, setting in layer.items():
            chosen.setdefault(key, setting)
    return Defaults(**chosen)
