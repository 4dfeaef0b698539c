"""Recipes: one YAML file that names a training launch completely.

A recipe says which script runs with which arguments, how it is launched
(pdsh, standard, torchrun), how many processes per node, the accelerate /
DeepSpeed options, the environment and the working directory. `load_recipe`
validates it with pydantic and reports every problem with the file and the
line of the offending key (a misspelled key gets its likely spelling). `${NAME}` in a value
is the head's environment variable NAME, `${RECIPE_DIR}` the recipe's directory; an unset
one is refused. Pure apart from reading the file and the head's environment.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from orchestrator.errors import InputFileError, UsageError
from orchestrator.specs.inventory import (
    Hostfile,
    expand_nodeset,
    is_node_count,
    make_hostfile,
    read_hostfile,
)
from orchestrator.specs.recipe_model import (
    AccelerateOptions,
    DynamoOptions,
    Launcher,
    OffloadDevice,
    Recipe,
    RecoveryOptions,
    SlurmOptions,
    TorchrunOptions,
)
from orchestrator.specs.yaml_lines import line_for, load_yaml_with_lines

# The models are recipe_model's; this module is where the rest of orch takes them from.
__all__ = [
    "AccelerateOptions", "DynamoOptions", "Launcher", "OffloadDevice", "Recipe",
    "RecoveryOptions", "SlurmOptions", "TorchrunOptions", "accelerate_options",
    "load_recipe", "parse_recipe", "recipe_hosts", "section_keys", "unknown_key_hint",
]  # fmt: skip

# `${NAME}`: the head's variable NAME; `$${NAME}`: the text `${NAME}` itself.
_VARIABLE = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def load_recipe(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Recipe:
    """Read and validate a recipe, its `${NAME}` taken from `environ` (the head's own by
    default); every problem is an InputFileError with file and line."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(name, "recipe not found", hint="see recipes/ for examples") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputFileError(name, f"cannot read recipe: {err}") from None
    return parse_recipe(text, source=name, environ=os.environ if environ is None else environ)


def parse_recipe(text: str, source: str = "<recipe>",
                 environ: Mapping[str, str] | None = None) -> Recipe:  # fmt: skip
    """Validate recipe text; `${RECIPE_DIR}` refers to the directory of `source`, any other
    `${NAME}` to `environ` (none given: no variable is set)."""
    data, lines = load_yaml_with_lines(text, source)
    if not isinstance(data, dict):
        raise InputFileError(
            source, "a recipe is a YAML mapping (name:, script:, launcher:, ...)", line=1
        )
    if "source" in data:
        raise InputFileError(source, "unknown key 'source'", line=lines.get(("source",)))
    if "nodes" in data:
        raise _top_level_nodes(data["nodes"], source, lines.get(("nodes",)))
    known = {"RECIPE_DIR": str(Path(source).resolve().parent), **(environ or {})}
    data = _expanded(data, (), known, _UnsetVariables(source, lines))
    data["source"] = source
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise _first_problem(err, lines, source) from None


class _UnsetVariables:
    """Where a recipe names a variable the head does not set: the error names the first,
    its key and line, and the fix."""

    def __init__(self, source: str, lines: dict[tuple, int]) -> None:
        self.source = source
        self.lines = lines

    def refuse(self, name: str, value: str, path: tuple) -> InputFileError:
        where = ".".join(str(part) for part in path)
        return InputFileError(
            self.source,
            f"{where}: ${{{name}}} in {value!r} is not set on the head (orch takes ${{NAME}} "
            "from the environment orch runs in)",
            line=line_for(path, self.lines),
            hint=f"export {name}=... before running orch, or write $${{{name}}} for the text "
            f"${{{name}}} itself",
        )


def _expanded(value: Any, path: tuple, known: Mapping[str, str], unset: _UnsetVariables,
              inside: frozenset[int] = frozenset()) -> Any:  # fmt: skip
    """`value` with `${NAME}` replaced in every text it holds (keys stay as they are).
    `inside`: the containers on the way here; a YAML alias of one of them (a recursive
    recipe) is left as it is, for the validation to refuse."""
    if isinstance(value, dict | list):
        if id(value) in inside:
            return value
        inside = inside | {id(value)}
    if isinstance(value, dict):
        return {key: _expanded(item, (*path, key), known, unset, inside)
                for key, item in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_expanded(item, (*path, at), known, unset, inside)
                for at, item in enumerate(value)]  # fmt: skip
    if not isinstance(value, str) or "${" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        escaped, name = match.groups()
        if escaped:
            return "${" + name + "}"
        if name not in known:
            raise unset.refuse(name, value, path)
        return known[name]

    return _VARIABLE.sub(substitute, value)


def _top_level_nodes(value: Any, source: str, line: int | None) -> InputFileError:
    """`nodes:` at the top was a node set: it is `nodelist:` now, and a count of nodes goes
    under recovery: or slurm: (as srun's -N)."""
    if is_node_count(value):
        return InputFileError(source, "'nodes' at the top level: a count of nodes goes under "
                              "recovery: (the first N healthy nodes) or slurm: (how many to "
                              "ask Slurm for)", line=line,
                              hint=f"did you mean recovery: {{nodes: {value}}}?")  # fmt: skip
    return InputFileError(source, "'nodes' is a count of nodes (under recovery: and slurm:); "
                          "a node set is 'nodelist'", line=line,
                          hint=f"did you mean nodelist: {value}?")  # fmt: skip


# A recipe in recipes/ that uses each section's keys: the hint of a misspelled key there.
EXAMPLE_RECIPES: dict[tuple[str, ...], str] = {
    (): "recipes/cpu-resume.yaml",
    ("accelerate",): "recipes/diffsynth-wan22-i2v-4x8.yaml",
    ("accelerate", "dynamo"): "recipes/diffsynth-wan22-i2v-4x8.yaml",
    ("torchrun",): "recipes/sana-torchrun-c10d.yaml",
    ("slurm",): "recipes/cpu-smoke-slurm.yaml",
    ("recovery",): "recipes/cpu-resume.yaml",
}
KEYS_REFERENCE = "docs/reference/recipes.md"  # every key, its type and default


def _first_problem(err: ValidationError, lines: dict[tuple, int], source: str) -> InputFileError:
    problem = err.errors(include_url=False)[0]
    loc = tuple(problem["loc"])
    line = line_for(loc, lines)
    where = ".".join(str(part) for part in loc)
    message = problem["msg"].removeprefix("Value error, ")
    if problem["type"] == "extra_forbidden":
        message = f"unknown key {where!r}"
        hint = unknown_key_hint(loc)
    elif problem["type"] == "missing":
        message = f"missing required key {where!r}"
        hint = None
    else:
        message = f"{where}: {message}" if where else message
        hint = None
    return InputFileError(source, message, line=line, hint=hint)


def section_keys() -> dict[tuple[str, ...], tuple[str, ...]]:
    """The keys a recipe takes, by section: () the top level, ('accelerate',) its section."""
    sections: dict[tuple[str, ...], type[BaseModel]] = {
        (): Recipe, ("accelerate",): AccelerateOptions, ("accelerate", "dynamo"): DynamoOptions,
        ("torchrun",): TorchrunOptions, ("slurm",): SlurmOptions, ("recovery",): RecoveryOptions,
    }  # fmt: skip
    return {where: tuple(k for k in model.model_fields if k != "source")
            for where, model in sections.items()}  # fmt: skip


def unknown_key_hint(loc: tuple) -> str:
    """What a misspelled key likely is (difflib), or the section it belongs to, and a
    recipe that uses that section's keys."""
    *parent, key = (str(part) for part in loc)
    keys = section_keys()
    here = keys.get(tuple(parent), ())
    close = difflib.get_close_matches(key, here, n=1, cutoff=0.6)
    elsewhere = [where for where, names in keys.items() if key in names and where != tuple(parent)]
    section = tuple(parent)
    if close:
        guess = f"did you mean {close[0]!r}? "
    elif elsewhere:
        section = elsewhere[0]
        place = f"in the {'.'.join(section)}: section" if section else "at the top level"
        guess = f"{key!r} goes {place}; "
    else:
        guess = ""
    example = EXAMPLE_RECIPES.get(section, EXAMPLE_RECIPES[()])
    return f"{guess}see {example} for an example, and {KEYS_REFERENCE} for every key"


def recipe_hosts(recipe: Recipe, hostfile: str | os.PathLike[str] | None = None) -> Hostfile:
    """The hosts a recipe runs on: `hostfile` (e.g. --hostfile) wins, then the recipe's own."""
    if hostfile is not None:
        return read_hostfile(hostfile)
    if recipe.hostfile is not None:
        return read_hostfile(recipe.hostfile)
    if recipe.nodelist is not None:
        if recipe.nproc_per_node is None:
            raise InputFileError(
                recipe.source or "<recipe>",
                "'nodelist' needs 'nproc_per_node' (the slots of each node)",
            )
        return make_hostfile(expand_nodeset(recipe.nodelist), recipe.nproc_per_node)
    raise UsageError(
        f"recipe {recipe.name!r} names no hosts",
        hint="pass --hostfile FILE (or -w NODESET), or set 'hostfile:' or 'nodelist:' in the "
        "recipe",
    )


def accelerate_options(**values: Any) -> AccelerateOptions:
    """AccelerateOptions from keyword values (e.g. command-line options), as a UsageError."""
    try:
        return AccelerateOptions.model_validate(values)
    except ValidationError as err:
        problem = err.errors(include_url=False)[0]
        where = ".".join(str(part) for part in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        raise UsageError(f"{where}: {message}" if where else message) from None
