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
import functools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.json_schema import SkipJsonSchema

from orchestrator.errors import InputFileError, UsageError
from orchestrator.specs import jobenv
from orchestrator.specs.constants import PORT_RANGE
from orchestrator.specs.hang import hang_timeout_value
from orchestrator.specs.inventory import (
    Hostfile,
    expand_nodeset,
    is_node_count,
    make_hostfile,
    read_hostfile,
)
from orchestrator.specs.options import LAUNCHER_ALIASES
from orchestrator.specs.stop import duration_seconds, signal_named
from orchestrator.specs.yaml_lines import line_for, load_yaml_with_lines

# In any value, this is replaced by the recipe file's directory.
RECIPE_DIR_VAR = "${RECIPE_DIR}"
# `${NAME}`: the head's variable NAME; `$${NAME}`: the text `${NAME}` itself.
_VARIABLE = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")


OffloadDevice = Literal["none", "cpu", "nvme"]
Launcher = Literal["pdsh", "standard", "torchrun"]

# What the JSON Schema says of values YAML may write as numbers: the validators take them
# as text (`args: [--steps, 30]`, `env: {OMP_NUM_THREADS: 1}`).
_TEXT_OR_NUMBER: dict[str, Any] = {"type": ["string", "number"]}
_TEXTS = {"items": _TEXT_OR_NUMBER}


def _text_number_or_null(schema: dict[str, Any]) -> None:
    """A duration (`time_limit: 90m` or `3600`) or nothing, in the schema."""
    schema.pop("anyOf", None)
    schema["type"] = ["string", "number", "null"]


@functools.cache
def _dynamo_vocabulary() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """accelerate's dynamo backends and modes; imported on first use because importing
    accelerate pulls in torch, which would slow every `orch` command down."""
    from accelerate.utils.constants import TORCH_DYNAMO_MODES
    from accelerate.utils.dataclasses import DynamoBackend

    return tuple(DynamoBackend.__members__), tuple(TORCH_DYNAMO_MODES)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DynamoOptions(_Strict):
    """accelerate's dynamo_config (torch.compile settings)."""

    backend: str = "NO"
    mode: str = "default"
    use_dynamic: bool = False
    use_fullgraph: bool = False
    use_regional_compilation: bool = False

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        backends = _dynamo_vocabulary()[0]
        if value.upper() not in backends:
            known = ", ".join(backends)
            raise ValueError(f"unknown dynamo backend {value!r}; one of {known}")
        return value.upper()

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, value: str) -> str:
        modes = _dynamo_vocabulary()[1]
        if value not in modes:
            known = ", ".join(modes)
            raise ValueError(f"unknown dynamo mode {value!r}; one of {known}")
        return value


class AccelerateOptions(_Strict):
    """The accelerate / DeepSpeed settings of a launch (what `accelerate config` asks)."""

    distributed_type: Literal["DEEPSPEED", "MULTI_GPU"] = "DEEPSPEED"
    zero_stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer_device: OffloadDevice = "none"
    offload_param_device: OffloadDevice = "none"
    # validate_default: an 'nvme' device without its path is caught too.
    offload_optimizer_nvme_path: str | None = Field(None, validate_default=True)
    offload_param_nvme_path: str | None = Field(None, validate_default=True)
    zero3_init_flag: bool = False
    zero3_save_16bit_model: bool = False
    gradient_accumulation_steps: int = Field(1, ge=1)
    gradient_clipping: float | None = Field(None, gt=0)
    mixed_precision: Literal["no", "fp16", "bf16", "fp8"] = "no"
    downcast_bf16: bool = False
    dynamo: DynamoOptions | None = None
    rdzv_backend: Literal["static", "c10d", "etcd", "etcd-v2"] = "static"
    same_network: bool = False
    use_cpu: bool = False
    debug: bool = False
    enable_cpu_affinity: bool = False
    main_training_function: str = "main"

    @field_validator("offload_optimizer_device", "offload_param_device")
    @classmethod
    def _offload_needs_zero(cls, value: str, info: ValidationInfo) -> str:
        stage = info.data.get("zero_stage")
        if value != "none" and stage is not None and stage < 2:
            # accelerate's own `accelerate config` offers offload only from ZeRO stage 2.
            raise ValueError(
                f"offload to {value!r} needs zero_stage 2 or 3 (zero_stage is {stage})"
            )
        if value == "nvme" and stage is not None and stage != 3:
            raise ValueError("offload to 'nvme' (ZeRO-Infinity) needs zero_stage 3")
        return value

    @field_validator("offload_optimizer_nvme_path", "offload_param_nvme_path")
    @classmethod
    def _nvme_path_matches_device(cls, value: str | None, info: ValidationInfo) -> str | None:
        device_field = info.field_name.replace("_nvme_path", "_device") if info.field_name else ""
        device = info.data.get(device_field)
        if device == "nvme" and not value:
            raise ValueError(f"{device_field} is 'nvme': set {info.field_name} to the NVMe mount")
        if device is not None and device != "nvme" and value:
            raise ValueError(
                f"{info.field_name} is set but {device_field} is {device!r}, not 'nvme'"
            )
        return value


class TorchrunOptions(_Strict):
    """Settings of `torchrun` on every node (launcher: torchrun)."""

    rdzv_backend: Literal["c10d", "static", "etcd", "etcd-v2"] = "c10d"
    rdzv_id: str | None = None  # None: the job id
    extra_args: list[str] = Field(default_factory=list, json_schema_extra=_TEXTS)

    @field_validator("extra_args", mode="before")
    @classmethod
    def _args_as_text(cls, value: Any) -> Any:
        return _scalars_to_text(value)


def _count_of_nodes(value: Any) -> Any:
    """A `nodes:` count; a node set there (what `nodes:` was at the top) says where it goes."""
    if isinstance(value, str) and not is_node_count(value):
        raise ValueError(f"{value!r} is a node set, and nodes here is a count (as srun's -N); "
                         f"a node set is the top-level key nodelist: {value}")  # fmt: skip
    return value


class SlurmOptions(_Strict):
    """What `orch submit RECIPE --sbatch` asks Slurm for (options on the command line win)."""

    nodes: int | None = Field(None, ge=1)
    gpus_per_node: int | None = Field(None, ge=1)
    time: str | None = None  # Slurm's --time: minutes, or [D-]HH:MM[:SS]
    partition: str | None = None
    account: str | None = None

    _nodes_count = field_validator("nodes", mode="before")(_count_of_nodes)


class RecoveryOptions(_Strict):
    """Restarts after a failure a restart can fix (options on the command line win)."""

    max_restarts: int = Field(0, ge=0)  # 0: one attempt
    restart_on: Literal["infra", "any"] = "infra"
    nodes: int | None = Field(None, ge=1)  # the first N healthy nodes; the rest are spares
    min_nodes: int | None = Field(None, ge=1)  # go on with fewer, down to this

    _nodes_count = field_validator("nodes", mode="before")(_count_of_nodes)


class Recipe(_Strict):
    """A complete description of one training launch."""

    name: str = Field(min_length=1)
    description: str | None = None
    script: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list, json_schema_extra=_TEXTS)
    # A tool's name is taken for its launcher's (deepspeed: pdsh, accelerate: standard).
    launcher: Launcher = Field(
        "pdsh", json_schema_extra={"enum": ["pdsh", "standard", "torchrun", *LAUNCHER_ALIASES]}
    )
    hostfile: str | None = None
    nodelist: str | None = None  # a node set (as -w), used when no hostfile is given
    nproc_per_node: int | None = Field(None, ge=1)  # None: the hostfile's slots
    workdir: str | None = None  # None: the head's working directory
    python: str | None = None  # None: the head's sys.executable
    env: dict[str, str] = Field(
        default_factory=dict, json_schema_extra={"additionalProperties": _TEXT_OR_NUMBER}
    )
    passthrough_env: list[str] = Field(default_factory=list)
    # Names in `env` whose values job records and dry runs may show (the rest show ***).
    env_keep: list[str] = Field(default_factory=list)
    # None: orch picks a port free on node 0 for each job
    main_port: int | None = Field(None, ge=PORT_RANGE[0], le=PORT_RANGE[1])
    # auto (learned from the job's pace), off, or seconds / a duration (--hang-timeout)
    hang_timeout: float | str | None = Field(None, json_schema_extra=_text_number_or_null)
    push_env: bool = False  # copy the head's environment to nodes where it differs (--push-env)
    stop_signal: str | None = None  # what a stop sends every rank (--stop-signal; SIGTERM)
    stop_grace: float | None = Field(None, gt=0)  # the ranks' time to save (--stop-grace)
    # 90m, 2h, 3600: the job is stopped then (--time-limit)
    time_limit: str | None = Field(None, json_schema_extra=_text_number_or_null)
    accelerate: AccelerateOptions = Field(default_factory=AccelerateOptions)
    torchrun: TorchrunOptions = Field(default_factory=TorchrunOptions)
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)
    recovery: RecoveryOptions = Field(default_factory=RecoveryOptions)
    # The file it was loaded from: set by orch, no key of the file (nor of the schema).
    source: SkipJsonSchema[str | None] = Field(None, exclude=True)

    @field_validator("args", mode="before")
    @classmethod
    def _args_as_text(cls, value: Any) -> Any:
        return _scalars_to_text(value)

    @field_validator("env", mode="before")
    @classmethod
    def _env_as_text(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        converted = {}
        for name, item in value.items():
            if isinstance(item, bool):
                raise ValueError(f"{name}: write the value in quotes (e.g. '1' or 'true')")
            converted[name] = str(item) if isinstance(item, int | float) else item
        return converted

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, item in value.items():
            _as_value_error(jobenv.check_name, name)
            _as_value_error(jobenv.check_value, name, item)
            if name in jobenv.ORCH_SET:
                raise ValueError(f"{name} is set by orch for each job")
        return value

    @field_validator("stop_signal")
    @classmethod
    def _signal_known(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return signal_named(value, "stop_signal")
        except UsageError as err:
            raise ValueError(err.message) from None

    @field_validator("hang_timeout", mode="before")
    @classmethod
    def _hang_timeout(cls, value: Any) -> Any:
        try:
            return hang_timeout_value(value, "hang_timeout")
        except UsageError as err:
            raise ValueError(err.message) from None

    @field_validator("time_limit", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
        text = _number_as_text(value)
        _as_value_error(duration_seconds, text, "time_limit")
        return text

    @field_validator("passthrough_env", "env_keep")
    @classmethod
    def _passthrough_names(cls, value: list[str]) -> list[str]:
        for name in value:
            _as_value_error(jobenv.check_name, name)
        return value

    @field_validator("launcher", mode="before")
    @classmethod
    def _launcher_by_tool(cls, value: Any) -> Any:
        return LAUNCHER_ALIASES.get(value, value) if isinstance(value, str) else value

    @field_validator("nodelist", mode="before")
    @classmethod
    def _nodelist_parse(cls, value: Any) -> Any:
        if is_node_count(value):
            raise ValueError(f"{value} is a count, and nodelist names the nodes ('gpu[01-04]'); "
                             f"a count goes under recovery: {{nodes: {value}}} (the first "
                             f"{value} healthy nodes) or slurm: {{nodes: {value}}}")  # fmt: skip
        if isinstance(value, str):
            _as_value_error(expand_nodeset, value)
        return value

    @field_validator("accelerate")
    @classmethod
    def _accelerate_fits_launcher(
        cls, value: AccelerateOptions, info: ValidationInfo
    ) -> AccelerateOptions:
        if info.data.get("launcher") == "pdsh" and value.distributed_type != "DEEPSPEED":
            raise ValueError(
                "launcher 'pdsh' is DeepSpeed's multinode launcher: distributed_type must be "
                f"DEEPSPEED, not {value.distributed_type} (use launcher 'standard' for MULTI_GPU)"
            )
        return value


def _scalars_to_text(value: Any) -> Any:
    """YAML reads `30` as a number; arguments and env values are text."""
    if isinstance(value, list):
        return [_number_as_text(item) for item in value]
    return value


def _number_as_text(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _as_value_error(check: Any, *args: Any) -> None:
    try:
        check(*args)
    except UsageError as err:
        raise ValueError(err.message) from None


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
