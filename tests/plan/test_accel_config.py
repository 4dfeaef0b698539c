"""accelerate configs: every file orch writes loads with accelerate's own loader."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from accelerate.utils.launch import prepare_deepspeed_cmd_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import UsageError
from orchestrator.plan.accel_config import (
    nproc_from_total,
    render_accelerate_config,
    render_standard_configs,
)
from orchestrator.specs.inventory import make_hostfile, render_hostfile
from orchestrator.specs.recipe import AccelerateOptions, DynamoOptions, accelerate_options

HOSTS4 = make_hostfile(["gpu01", "gpu02", "gpu03", "gpu04"], 8)
DIFFSYNTH = AccelerateOptions(
    zero_stage=2,
    offload_optimizer_device="cpu",
    offload_param_device="cpu",
    zero3_init_flag=True,
    gradient_clipping=1.0,
    mixed_precision="bf16",
    dynamo=DynamoOptions(
        backend="INDUCTOR", use_dynamic=True, use_fullgraph=True, use_regional_compilation=True
    ),
)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_pdsh_config_loads_with_intended_values(tmp_path: Path) -> None:
    hostfile = _write(tmp_path / "hostfile", render_hostfile(HOSTS4))
    text = render_accelerate_config(
        DIFFSYNTH,
        hosts=HOSTS4,
        nproc_per_node=8,
        main_ip="10.233.0.1",
        main_port=12345,
        launcher="pdsh",
        hostfile_path=hostfile,
    )
    config = load_config_from_file(_write(tmp_path / "pdsh.yaml", text))
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type == DistributedType.DEEPSPEED
    assert (config.num_machines, config.num_processes, config.machine_rank) == (4, 32, 0)
    assert (config.main_process_ip, config.main_process_port) == ("10.233.0.1", 12345)
    assert config.mixed_precision == "bf16"
    assert config.deepspeed_config == {
        "deepspeed_multinode_launcher": "pdsh",
        "deepspeed_hostfile": hostfile,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "offload_optimizer_device": "cpu",
        "offload_param_device": "cpu",
        "zero3_init_flag": True,
        "zero_stage": 2,
    }
    assert config.dynamo_config == {
        "dynamo_backend": "INDUCTOR",
        "dynamo_mode": "default",
        "dynamo_use_dynamic": True,
        "dynamo_use_fullgraph": True,
        "dynamo_use_regional_compilation": True,
    }


def test_relative_hostfile_is_written_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    text = render_accelerate_config(
        AccelerateOptions(),
        hosts=HOSTS4,
        nproc_per_node=8,
        main_ip="gpu01",
        main_port=29500,
        launcher="pdsh",
        hostfile_path="hf",
    )
    assert yaml.safe_load(text)["deepspeed_config"]["deepspeed_hostfile"] == str(tmp_path / "hf")


def test_accelerate_launch_turns_pdsh_config_into_deepspeed_pdsh_command(tmp_path: Path) -> None:
    hostfile = _write(tmp_path / "hostfile", render_hostfile(HOSTS4))
    port = _free_port()
    text = render_accelerate_config(
        AccelerateOptions(zero_stage=3, mixed_precision="fp16"),
        hosts=HOSTS4,
        nproc_per_node=8,
        main_ip="gpu01",
        main_port=port,
        launcher="pdsh",
        hostfile_path=hostfile,
    )
    config = _write(tmp_path / "pdsh.yaml", text)
    args = launch_command_parser().parse_args(["--config_file", config, "train.py", "--x", "1"])
    args, defaults, _ = _validate_launch_command(args)
    assert args.use_deepspeed
    # What accelerate's launch_command does before handing over to DeepSpeed.
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    cmd, _env = prepare_deepspeed_cmd_env(args)
    assert cmd[:7] == [
        "deepspeed",
        "--hostfile",
        hostfile,
        "--no_local_rank",
        "--launcher",
        "pdsh",
        "--num_gpus",
    ]
    assert cmd[7] == "8"
    assert cmd[-3:] == ["train.py", "--x", "1"]
    assert ["--master_addr", "gpu01", "--master_port", str(port)] == cmd[8:12]


def test_standard_configs_differ_only_in_machine_rank(tmp_path: Path) -> None:
    texts = render_standard_configs(
        DIFFSYNTH, hosts=HOSTS4, nproc_per_node=8, main_ip="10.233.0.1", main_port=12345
    )
    assert len(texts) == 4
    loaded = []
    for rank, text in enumerate(texts):
        config = ClusterConfig.from_yaml_file(_write(tmp_path / f"rank{rank}.yaml", text))
        assert config.machine_rank == rank
        assert config.deepspeed_config["deepspeed_multinode_launcher"] == "standard"
        assert "deepspeed_hostfile" not in config.deepspeed_config
        assert config.num_processes == 32
        loaded.append({k: v for k, v in config.to_dict().items() if k != "machine_rank"})
    assert all(item == loaded[0] for item in loaded)
    differing = [
        (a, b) for a, b in zip(texts[0].splitlines(), texts[3].splitlines(), strict=True) if a != b
    ]
    assert differing == [("machine_rank: 0", "machine_rank: 3")]


def test_standard_config_is_accepted_by_accelerate_launch(tmp_path: Path) -> None:
    texts = render_standard_configs(
        AccelerateOptions(),
        hosts=HOSTS4,
        nproc_per_node=2,
        main_ip="127.0.0.1",
        main_port=_free_port(),
    )
    args = launch_command_parser().parse_args(
        ["--config_file", _write(tmp_path / "r2.yaml", texts[2]), "train.py"]
    )
    args, _, _ = _validate_launch_command(args)
    assert (args.num_processes, args.num_machines, args.machine_rank) == (8, 4, 2)
    assert args.use_deepspeed
    assert args.deepspeed_multinode_launcher == "standard"


def test_multi_gpu_c10d_config(tmp_path: Path) -> None:
    options = AccelerateOptions(distributed_type="MULTI_GPU", rdzv_backend="c10d", debug=True)
    texts = render_standard_configs(
        options, hosts=HOSTS4, nproc_per_node=8, main_ip="10.0.0.1", main_port=29500
    )
    config = load_config_from_file(_write(tmp_path / "c.yaml", texts[1]))
    assert config.distributed_type == DistributedType.MULTI_GPU
    assert config.rdzv_backend == "c10d"
    assert config.debug is True
    assert (config.machine_rank, config.num_processes) == (1, 32)
    assert config.deepspeed_config == {}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"main_port": 0}, "port 0 is out of range"),
        ({"main_port": 70000}, "out of range"),
        ({"nproc_per_node": 9}, "has only 8 slots"),
        ({"nproc_per_node": 0}, "at least 1"),
        ({"launcher": "torchrun"}, "has no accelerate config"),
        ({"hostfile_path": None}, "needs the hostfile path"),
        ({"machine_rank": 4}, "outside 0..3"),
        ({"main_ip": "$(reboot)"}, "not allowed"),
        ({"options": AccelerateOptions(distributed_type="MULTI_GPU")}, "cannot use it"),
    ],
)
def test_inconsistent_values_are_refused(changes: dict, words: str) -> None:
    values = {
        "options": AccelerateOptions(),
        "hosts": HOSTS4,
        "nproc_per_node": 8,
        "main_ip": "gpu01",
        "main_port": 29500,
        "launcher": "pdsh",
        "hostfile_path": "/tmp/hf",
        "machine_rank": 0,
    }
    values.update(changes)
    options = values.pop("options")
    with pytest.raises(UsageError, match=words):
        render_accelerate_config(options, **values)


def test_multi_gpu_needs_two_processes() -> None:
    with pytest.raises(UsageError, match="at least 2 processes"):
        render_standard_configs(
            AccelerateOptions(distributed_type="MULTI_GPU"),
            hosts=make_hostfile(["a"], 1),
            nproc_per_node=1,
            main_ip="a",
            main_port=1234,
        )


def test_num_processes_must_split_evenly() -> None:
    assert nproc_from_total(32, 4) == 8
    with pytest.raises(UsageError, match="not a multiple of the 4 machines"):
        nproc_from_total(30, 4)


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"zero_stage": 1, "offload_optimizer_device": "cpu"}, "needs zero_stage 2 or 3"),
        ({"zero_stage": 0, "offload_param_device": "cpu"}, "needs zero_stage 2 or 3"),
        (
            {"zero_stage": 2, "offload_param_device": "nvme", "offload_param_nvme_path": "/nvme"},
            "needs zero_stage 3",
        ),
        ({"zero_stage": 3, "offload_optimizer_device": "nvme"}, "offload_optimizer_nvme_path"),
        ({"zero_stage": 3, "offload_param_nvme_path": "/nvme"}, "not 'nvme'"),
        ({"zero_stage": 4}, "zero_stage"),
        ({"mixed_precision": "fp32"}, "mixed_precision"),
        ({"dynamo": {"backend": "NOPE"}}, "unknown dynamo backend"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
        ({"zero_stagee": 2}, "zero_stagee"),
    ],
)
def test_option_combinations_accelerate_rejects(values: dict, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        accelerate_options(**values)


def test_zero3_nvme_offload_is_accepted(tmp_path: Path) -> None:
    options = accelerate_options(
        zero_stage=3,
        offload_optimizer_device="nvme",
        offload_optimizer_nvme_path="/nvme",
        offload_param_device="nvme",
        offload_param_nvme_path="/nvme",
        zero3_save_16bit_model=True,
    )
    text = render_accelerate_config(
        options,
        hosts=HOSTS4,
        nproc_per_node=8,
        main_ip="gpu01",
        main_port=29500,
        launcher="pdsh",
        hostfile_path="/hf",
    )
    config = load_config_from_file(_write(tmp_path / "c.yaml", text))
    assert config.deepspeed_config["offload_param_nvme_path"] == "/nvme"
    assert config.deepspeed_config["zero3_save_16bit_model"] is True


options_strategy = st.builds(
    AccelerateOptions,
    zero_stage=st.sampled_from([2, 3]),
    offload_optimizer_device=st.sampled_from(["none", "cpu"]),
    offload_param_device=st.sampled_from(["none", "cpu"]),
    gradient_accumulation_steps=st.integers(1, 64),
    gradient_clipping=st.none() | st.floats(0.01, 100),
    mixed_precision=st.sampled_from(["no", "fp16", "bf16"]),
    rdzv_backend=st.sampled_from(["static", "c10d"]),
    same_network=st.booleans(),
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    options=options_strategy,
    machines=st.integers(1, 16),
    nproc=st.integers(1, 8),
    port=st.integers(1, 65535),
)
def test_any_valid_config_loads_back_the_same(
    tmp_path: Path, options: AccelerateOptions, machines: int, nproc: int, port: int
) -> None:
    hosts = make_hostfile([f"n{i}" for i in range(machines)], 8)
    text = render_accelerate_config(
        options,
        hosts=hosts,
        nproc_per_node=nproc,
        main_ip="n0",
        main_port=port,
        launcher="pdsh",
        hostfile_path="/etc/orch/hostfile",
    )
    config = load_config_from_file(_write(tmp_path / "c.yaml", text))
    assert (config.num_machines, config.num_processes) == (machines, machines * nproc)
    assert config.main_process_port == port
    assert config.mixed_precision == options.mixed_precision
    assert config.rdzv_backend == options.rdzv_backend
    ds = config.deepspeed_config
    assert ds["zero_stage"] == options.zero_stage
    assert ds["offload_optimizer_device"] == options.offload_optimizer_device
    assert ds["gradient_accumulation_steps"] == options.gradient_accumulation_steps
    assert ds.get("gradient_clipping") == options.gradient_clipping
