"""accelerate config files, built with accelerate's own ClusterConfig.

Two shapes, as in the field: one config for DeepSpeed's pdsh multinode
launcher (run on the head, pdsh fans out), and for the standard launcher one
config per machine that differ only in `machine_rank`. Inconsistent values are
refused before any text is produced. Pure.
"""

from __future__ import annotations

import os

from orchestrator.errors import UsageError
from orchestrator.remote.accelerate_head import config_text
from orchestrator.specs.constants import CONFIG_LAUNCHERS
from orchestrator.specs.inventory import Hostfile, host_name_problem, processes_per_node
from orchestrator.specs.options import check_port
from orchestrator.specs.recipe import AccelerateOptions

_HEADER = "# accelerate config written by orch ({launcher} launcher, {machines} x {nproc})\n"


def cluster_config_fields(
    options: AccelerateOptions,
    *,
    hosts: Hostfile,
    nproc_per_node: int,
    main_ip: str,
    main_port: int,
    launcher: str,
    hostfile_path: str | None,
    machine_rank: int = 0,
) -> dict[str, object]:
    """The keyword arguments of accelerate's ClusterConfig for one machine, after checking
    every value. JSON-able: enums are given by name, as ClusterConfig accepts them."""
    _check_config_values(
        options, hosts, nproc_per_node, main_ip, main_port, launcher, hostfile_path
    )
    machines = len(hosts.hosts)
    if not 0 <= machine_rank < machines:
        raise UsageError(f"machine_rank {machine_rank} is outside 0..{machines - 1}")
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": options.distributed_type,
        "mixed_precision": options.mixed_precision,
        "use_cpu": options.use_cpu,
        "debug": options.debug,
        "num_processes": machines * nproc_per_node,
        "machine_rank": machine_rank,
        "num_machines": machines,
        "main_process_ip": main_ip,
        "main_process_port": main_port,
        "rdzv_backend": options.rdzv_backend,
        "same_network": options.same_network,
        "main_training_function": options.main_training_function,
        "enable_cpu_affinity": options.enable_cpu_affinity,
        "deepspeed_config": _deepspeed_section(options, launcher, hostfile_path),
        "dynamo_config": _dynamo_section(options),
        "downcast_bf16": options.downcast_bf16,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }


def config_header(launcher: str, machines: int, nproc_per_node: int) -> str:
    return _HEADER.format(launcher=launcher, machines=machines, nproc=nproc_per_node)


def render_accelerate_config(
    options: AccelerateOptions,
    *,
    hosts: Hostfile,
    nproc_per_node: int,
    main_ip: str,
    main_port: int,
    launcher: str,
    hostfile_path: str | None,
    machine_rank: int = 0,
) -> str:
    """YAML text that `accelerate launch --config_file` loads."""
    fields = cluster_config_fields(
        options,
        hosts=hosts,
        nproc_per_node=nproc_per_node,
        main_ip=main_ip,
        main_port=main_port,
        launcher=launcher,
        hostfile_path=hostfile_path,
        machine_rank=machine_rank,
    )
    # The same function writes the pdsh config on the head at launch time.
    return config_text(fields, config_header(launcher, len(hosts.hosts), nproc_per_node))


def render_standard_configs(
    options: AccelerateOptions,
    *,
    hosts: Hostfile,
    nproc_per_node: int,
    main_ip: str,
    main_port: int,
    hostfile_path: str | None = None,
) -> list[str]:
    """One standard-launcher config per machine rank (index K is machine_rank K);
    they differ only there."""
    return [
        render_accelerate_config(
            options,
            hosts=hosts,
            nproc_per_node=nproc_per_node,
            main_ip=main_ip,
            main_port=main_port,
            launcher="standard",
            hostfile_path=hostfile_path,
            machine_rank=rank,
        )
        for rank in range(len(hosts.hosts))
    ]


def nproc_from_total(num_processes: int, machines: int) -> int:
    """Processes per node from a total, which must split evenly over the machines."""
    if machines < 1:
        raise UsageError("no machines")
    if num_processes < 1 or num_processes % machines:
        raise UsageError(
            f"num_processes {num_processes} is not a multiple of the {machines} machines",
            hint="accelerate starts num_processes / num_machines processes on every machine",
        )
    return num_processes // machines


def _check_config_values(
    options: AccelerateOptions,
    hosts: Hostfile,
    nproc_per_node: int,
    main_ip: str,
    main_port: int,
    launcher: str,
    hostfile_path: str | None,
) -> None:
    if launcher not in CONFIG_LAUNCHERS:
        raise UsageError(
            f"launcher {launcher!r} has no accelerate config",
            hint=f"accelerate configs are for the {' and '.join(CONFIG_LAUNCHERS)} launchers",
        )
    if not hosts.hosts:
        raise UsageError("no hosts to write a config for")
    processes_per_node(hosts, nproc_per_node)
    check_port(main_port, "main process port")
    problem = host_name_problem(main_ip)
    if problem is not None:
        raise UsageError(f"main process address: {problem}")
    if launcher == "pdsh":
        if options.distributed_type != "DEEPSPEED":
            raise UsageError(
                f"the pdsh launcher is DeepSpeed's: distributed_type {options.distributed_type} "
                "cannot use it",
                hint="use the standard launcher for MULTI_GPU",
            )
        if not hostfile_path:
            raise UsageError("the pdsh launcher needs the hostfile path (deepspeed_hostfile)")
    if options.distributed_type == "MULTI_GPU" and len(hosts.hosts) * nproc_per_node < 2:
        raise UsageError("MULTI_GPU needs at least 2 processes in total (accelerate's rule)")


def _deepspeed_section(
    options: AccelerateOptions, launcher: str, hostfile_path: str | None
) -> dict[str, object]:
    if options.distributed_type != "DEEPSPEED":
        return {}
    section: dict[str, object] = {
        "deepspeed_multinode_launcher": launcher,
        "gradient_accumulation_steps": options.gradient_accumulation_steps,
        "offload_optimizer_device": options.offload_optimizer_device,
        "offload_param_device": options.offload_param_device,
        "zero3_init_flag": options.zero3_init_flag,
        "zero_stage": options.zero_stage,
    }
    if launcher == "pdsh" and hostfile_path:
        # Absolute: DeepSpeed's runner reads it from wherever accelerate is started.
        section["deepspeed_hostfile"] = os.path.abspath(hostfile_path)
    if options.gradient_clipping is not None:
        section["gradient_clipping"] = options.gradient_clipping
    if options.zero3_save_16bit_model:
        section["zero3_save_16bit_model"] = True
    if options.offload_optimizer_nvme_path:
        section["offload_optimizer_nvme_path"] = options.offload_optimizer_nvme_path
    if options.offload_param_nvme_path:
        section["offload_param_nvme_path"] = options.offload_param_nvme_path
    return section


def _dynamo_section(options: AccelerateOptions) -> dict[str, object]:
    dynamo = options.dynamo
    if dynamo is None or dynamo.backend == "NO":
        return {}
    return {
        "dynamo_backend": dynamo.backend,
        "dynamo_mode": dynamo.mode,
        "dynamo_use_dynamic": dynamo.use_dynamic,
        "dynamo_use_fullgraph": dynamo.use_fullgraph,
        "dynamo_use_regional_compilation": dynamo.use_regional_compilation,
    }
