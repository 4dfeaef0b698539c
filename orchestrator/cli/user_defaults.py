"""The defaults in force for this command (specs/defaults.py): read from ORCH_HOSTFILE, the
working directory's orch.toml and the user's config.toml, and put where the command line
gave nothing, under a recipe's own values; each one used is said on stderr with where it
came from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli.documents import err_console
from orchestrator.errors import UsageError
from orchestrator.records.job import RUNS_DIR_VAR
from orchestrator.specs.defaults import (
    PROJECT_FILE,
    Defaults,
    Setting,
    environment_defaults,
    merged,
    parse_defaults,
    user_file,
)
from orchestrator.specs.slurm import allocation_from_env

if TYPE_CHECKING:  # the recipe's model and the job's options cost pydantic to import
    from orchestrator.cli.jobs.job_options import JobOptions
    from orchestrator.specs.recipe_model import Recipe


def _read(path: Path) -> dict[str, Setting]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: the defaults file cannot be read ({err})",
                         "fix its permissions or remove it") from None  # fmt: skip
    return parse_defaults(text, path)


def read_defaults(environ: Mapping[str, str] = os.environ, cwd: Path | None = None,
                  home: Path | None = None) -> Defaults:  # fmt: skip
    """The defaults in force: the environment's, then the project's file, then the user's."""
    cwd = Path.cwd() if cwd is None else cwd
    home = Path.home() if home is None else home
    return merged([environment_defaults(environ, cwd), _read(cwd / PROJECT_FILE),
                   _read(user_file(environ, home))])  # fmt: skip


def say_defaults(said: list[str]) -> None:
    """Each default used, on stderr (stdout may hold a JSON document)."""
    err = err_console()
    for line in said:
        err.print(line, markup=False)


def _said(option: str, setting: Setting) -> str:
    return f"default: {option} {setting.value} (from {setting.source})"


def default_hostfile(defaults: Defaults, given: Path | None, *, nodelist: str | None = None,
                     slurm: bool = False, recipe: Recipe | None = None,
                     said: list[str]) -> Path | None:  # fmt: skip
    """--hostfile as given, else the default one, unless the nodes are named already: by -w
    or --slurm (--sbatch: Slurm allocates them), by the recipe, or by the Slurm allocation
    this runs in."""
    named = given is not None or nodelist is not None or slurm
    by_recipe = recipe is not None and (recipe.hostfile or recipe.nodelist) is not None
    if named or by_recipe or defaults.hostfile is None or allocation_from_env(os.environ):
        return given
    said.append(_said("--hostfile", defaults.hostfile))
    return Path(defaults.hostfile.value)


def default_launcher(defaults: Defaults, given: str | None, *, recipe: Recipe | None = None,
                     allowed: tuple[str, ...] | None = None,
                     said: list[str]) -> str | None:  # fmt: skip
    """--launcher as given, else the default one, unless a recipe names its own (or the
    command takes none of that kind: `allowed`)."""
    setting = defaults.launcher
    if given is not None or setting is None or recipe is not None:
        return given
    if allowed is not None and setting.value not in allowed:
        return given
    said.append(_said("--launcher", setting))
    return setting.value


def default_python(defaults: Defaults, given: str | None, *, recipe: Recipe | None = None,
                   said: list[str]) -> str | None:  # fmt: skip
    """--python as given, else the recipe's (None here: the plan takes it), else the default."""
    if given is not None or defaults.python is None or (recipe and recipe.python is not None):
        return given
    said.append(_said("--python", defaults.python))
    return defaults.python.value


def default_runs_dir(defaults: Defaults, given: Path | None, *, said: list[str],
                     environ: Mapping[str, str] = os.environ) -> Path | None:  # fmt: skip
    """--runs-dir as given, else (no ORCH_RUNS_DIR, which goes first) the default one."""
    if given is not None or defaults.runs_dir is None or environ.get(RUNS_DIR_VAR):
        return given
    said.append(_said("--runs-dir", defaults.runs_dir))
    return Path(defaults.runs_dir.value)


def runs_dir_option(given: Path | None) -> Path | None:
    """What a command that reads the records takes for --runs-dir: as given, else the
    default one (not said: what these commands print names the directory)."""
    return default_runs_dir(read_defaults(), given, said=[])


def with_defaults(options: JobOptions, defaults: Defaults, recipe: Recipe | None = None,
                  *, sbatch: bool = False) -> tuple[JobOptions, list[str]]:  # fmt: skip
    """`options` with the defaults where neither they nor the recipe say, and a line for
    each default used. A recipe names its own launcher: only `orch launch` takes one."""
    said: list[str] = []
    hostfile = default_hostfile(defaults, options.hostfile, nodelist=options.nodelist,
                                slurm=options.slurm or sbatch, recipe=recipe,
                                said=said)  # fmt: skip
    launcher = default_launcher(defaults, options.launcher, recipe=recipe, said=said)
    python = default_python(defaults, options.python, recipe=recipe, said=said)
    runs_dir = default_runs_dir(defaults, options.runs_dir, said=said)
    options = replace(options, hostfile=hostfile, launcher=launcher, python=python,
                      runs_dir=runs_dir)  # fmt: skip
    return options, said
