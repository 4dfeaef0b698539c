"""A recipe's keys as pydantic models: the top level (`Recipe`) and its sections
(accelerate, accelerate.dynamo, torchrun, slurm, recovery), each value checked as it is read.
specs/recipe.py reads a recipe file into them and says where a problem is. Pure.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic.json_schema import SkipJsonSchema

from orchestrator.errors import UsageError
from orchestrator.specs import jobenv
from orchestrator.specs.checkpoints import bandwidth_bytes, check_dir
from orchestrator.specs.constants import PORT_RANGE
from orchestrator.specs.hang import hang_timeout_value
from orchestrator.specs.inventory import expand_nodeset, is_node_count
from orchestrator.specs.options import LAUNCHER_ALIASES
from orchestrator.specs.stop import duration_seconds, signal_named

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
    # Requeued when stopped for its time limit or a preemption, to go on in a new allocation
    # under the same job id (`--requeue`); at most max_requeues times (None: the default).
    requeue: bool = False
    max_requeues: int | None = Field(None, ge=0)

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
    # Where the job writes its checkpoints, the same path on every node (--checkpoint-dir);
    # relative: in the workdir. Without a shared filesystem, orch copies each complete one to
    # checkpoint_copies other nodes, at most checkpoint_bandwidth bytes per second.
    checkpoint_dir: str | None = None
    checkpoint_copies: int | None = Field(None, ge=1)  # 1 by default (--checkpoint-copies)
    # 200M by default, 1G, 500k, 0 or off: no cap (--checkpoint-bandwidth)
    checkpoint_bandwidth: int | None = Field(None, json_schema_extra=_text_number_or_null)
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
        return None if value is None else _as_value_error(signal_named, value, "stop_signal")

    @field_validator("hang_timeout", mode="before")
    @classmethod
    def _hang_timeout(cls, value: Any) -> Any:
        return _as_value_error(hang_timeout_value, value, "hang_timeout")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
        text = _number_as_text(value)
        _as_value_error(duration_seconds, text, "time_limit")
        return text

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint_dir(cls, value: str | None) -> str | None:
        return None if value is None else _as_value_error(check_dir, value, "checkpoint_dir")

    @field_validator("checkpoint_copies")
    @classmethod
    def _checkpoint_copies(cls, value: int | None, info: ValidationInfo) -> int | None:
        _with_checkpoint_dir(info, "checkpoint_copies")
        return value

    @field_validator("checkpoint_bandwidth", mode="before")
    @classmethod
    def _checkpoint_bandwidth(cls, value: Any, info: ValidationInfo) -> Any:
        _with_checkpoint_dir(info, "checkpoint_bandwidth")
        if value is None or isinstance(value, bool):
            return value
        return _as_value_error(bandwidth_bytes, value, "checkpoint_bandwidth")

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


def _with_checkpoint_dir(info: ValidationInfo, key: str) -> None:
    """A key that says how checkpoints are copied needs the directory they are in (a
    checkpoint_dir given and refused is not in info.data: its own problem is the one told)."""
    if "checkpoint_dir" in info.data and info.data["checkpoint_dir"] is None:
        raise ValueError(f"{key} goes with checkpoint_dir: add checkpoint_dir: PATH (where "
                         f"the job writes its checkpoints), or leave {key} out")  # fmt: skip


def _scalars_to_text(value: Any) -> Any:
    """YAML reads `30` as a number; arguments and env values are text."""
    if isinstance(value, list):
        return [_number_as_text(item) for item in value]
    return value


def _number_as_text(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _as_value_error(check: Any, *args: Any) -> Any:
    """`check(*args)`'s value; its UsageError as the ValueError pydantic reports."""
    try:
        return check(*args)
    except UsageError as err:
        raise ValueError(err.message) from None
