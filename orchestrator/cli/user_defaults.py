"""The defaults in force for this command (specs/defaults.py): read from ORCH_HOSTFILE, the
working directory's orch.toml and the user's config.toml, and put where the command line
gave nothing, under a recipe's own values; each one used is said on stderr with where it
came from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from orchestrator.cli.job_options import JobOptions
from orchestrator.errors import UsageError
from orchestrator.specs.defaults import (
    PROJECT_FILE,
    Defaults,
    Setting,
    environment_defaults,
    merged,
    parse_defaults,
    user_file,
)
from orchestrator.specs.recipe_model import Recipe
from orchestrator.specs.slurm import allocation_from_env


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


def _said(option: str, setting: Setting) -> str:
    return f"default: {option} {setting.value} (from {setting.source})"


def _hosts_given(options: JobOptions, recipe: Recipe | None) -> bool:
    """Whether the job's nodes are named already: on the command line, by the recipe, or by
    the Slurm allocation this runs in."""
    named = options.hostfile is not None or options.nodelist is not None or options.slurm
    by_recipe = recipe is not None and (recipe.hostfile or recipe.nodelist) is not None
    return named or by_recipe or allocation_from_env(os.environ) is not None


def with_defaults(options: JobOptions, defaults: Defaults,
                  recipe: Recipe | None = None) -> tuple[JobOptions, list[str]]:  # fmt: skip
    """`options` with the defaults where neither they nor the recipe say, and a line for
    each default used. A recipe names its own launcher: only `orch launch` takes one."""
    said = []
    if defaults.hostfile is not None and not _hosts_given(options, recipe):
        options = replace(options, hostfile=Path(defaults.hostfile.value))
        said.append(_said("--hostfile", defaults.hostfile))
    if defaults.launcher is not None and recipe is None and options.launcher is None:
        options = replace(options, launcher=defaults.launcher.value)
        said.append(_said("--launcher", defaults.launcher))
    recipe_python = recipe.python if recipe is not None else None
    if defaults.python is not None and options.python is None and recipe_python is None:
        options = replace(options, python=defaults.python.value)
        said.append(_said("--python", defaults.python))
    return options, said
