"""`orch hostfile` and `orch config`: write the files a multi-node launch needs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from orchestrator.cli.app import app
from orchestrator.cli.options import EXCLUDE, INCLUDE, examples, nodelist_option, one_of
from orchestrator.cli.user_defaults import (
    default_hostfile,
    default_launcher,
    read_defaults,
    say_defaults,
)
from orchestrator.errors import OrchError, UsageError
from orchestrator.plan.accel_config import (
    nproc_from_total,
    render_accelerate_config,
    render_standard_configs,
)
from orchestrator.specs.constants import (
    CONFIG_LAUNCHERS,
    DEFAULT_MAIN_PORT,
    HOSTFILE_NAME,
    PDSH_CONFIG_NAME,
    standard_config_name,
)
from orchestrator.specs.inventory import (
    NODESET_SOURCE,
    Hostfile,
    expand_nodeset,
    filter_hosts,
    make_hostfile,
    processes_per_node,
    read_hostfile,
    render_hostfile,
)
from orchestrator.specs.options import launcher_named
from orchestrator.specs.recipe import (
    AccelerateOptions,
    Recipe,
    accelerate_options,
    load_recipe,
    recipe_hosts,
)


@app.command(
    "hostfile",
    epilog=examples(
        "orch hostfile -w 'gpu[01-04]' --slots 8 -o hostfile",
        "# slots from the GPUs each node has",
        "orch hostfile -w 'gpu[01-04]' --slots auto -o hostfile",
    ),
)
def hostfile_command(
    nodes: str | None = nodelist_option(
        "Node set, e.g. 'gpu[01-16]' or 'a,b,c' (first = main node)."
    ),
    slots: str | None = typer.Option(
        None,
        "--slots",
        metavar="N|auto",
        help="Slots per node: a number, or 'auto' (GPUs of each node, over SSH).",
    ),
    source: Annotated[
        Path | None,
        typer.Option("--from", help="Start from this hostfile instead of -w (filter, check)."),
    ] = None,
    include: str | None = INCLUDE,
    exclude: str | None = EXCLUDE,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write here and print the path (default: print it)."),
    ] = None,
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds per node for --slots auto."),
) -> None:
    """Write a DeepSpeed hostfile ('host slots=N' lines) from a node set.

    Exit codes: 0 written; 1 a node did not say its GPUs (--slots auto); 2 a usage error."""
    hosts = _hostfile_from_options(nodes, slots, source, timeout)
    hosts = filter_hosts(hosts, include=include, exclude=exclude)
    text = render_hostfile(hosts)
    if output is None:
        typer.echo(text, nl=False)
        return
    _write(output, text)
    typer.echo(str(output.resolve()))


def _hostfile_from_options(
    nodes: str | None, slots: str | None, source: Path | None, timeout: float
) -> Hostfile:
    if (nodes is None) == (source is None):
        raise UsageError(
            "give either -w/--nodelist or --from",
            hint="e.g. orch hostfile -w 'gpu[01-04]' --slots 8 -o hostfile",
        )
    if source is not None:
        if slots is not None:
            raise UsageError("--slots goes with -w/--nodelist, not --from")
        return read_hostfile(source)
    assert nodes is not None
    names = expand_nodeset(nodes)
    if slots is None:
        raise UsageError("-w/--nodelist needs --slots N or --slots auto")
    if slots.strip().lower() == "auto":
        counts = _gpu_counts(names, timeout)
        return make_hostfile(names, [counts[name] for name in names])
    return make_hostfile(names, _parse_slots(slots))


def _parse_slots(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--slots {text!r}: give a number or 'auto'") from None
    if value < 1:
        raise UsageError(f"--slots {value}: a node needs at least one slot")
    return value


def _gpu_counts(names: list[str], timeout: float) -> dict[str, int]:
    """Each node's GPU count from the node probe; every failing node is reported at once."""
    # Imported here: only --slots auto needs SSH, the other commands stay offline.
    from orchestrator.probe.commands import probe_command
    from orchestrator.probe.facts import ProbeError, parse_facts
    from orchestrator.remote.owned import root_setting
    from orchestrator.ssh import run_on_nodes

    command = probe_command(sys.executable, workdir=None, script=None, names=names,
                            node_root=root_setting(os.environ))  # fmt: skip
    outcomes = run_on_nodes(names, command, timeout=timeout, connect_timeout=timeout)
    counts: dict[str, int] = {}
    problems: list[str] = []
    for outcome in outcomes:
        if outcome.value is None:
            problems.append(outcome.problem or outcome.node)
            continue
        try:
            facts = parse_facts(outcome.node, outcome.value.stdout)
        except ProbeError as err:
            problems.append(f"{outcome.node}: the probe failed: {err}")
            continue
        if facts.gpu_count < 1:
            why = "nvidia-smi not found" if facts.nvidia_smi == "absent" else facts.nvidia_smi
            problems.append(f"{outcome.node}: no GPUs found ({why})")
        counts[outcome.node] = facts.gpu_count
    if problems:
        no_gpu = all("no GPUs found" in p for p in problems) and len(problems) == len(names)
        raise OrchError(
            "--slots auto: " + "; ".join(problems),
            hint="these nodes have no GPUs: give the slots yourself, e.g. --slots 2"
            if no_gpu
            else "fix the nodes above (see `orch doctor`), or give --slots N",
        )
    return counts


def _choices(field: str) -> dict[str, Any]:
    """An accelerate option's words, as the recipe's model allows them."""
    return one_of(get_args(AccelerateOptions.model_fields[field].annotation))


@app.command(
    "config",
    epilog=examples(
        "orch config -H hostfile --zero-stage 3 --mixed-precision bf16",
        "# one config per machine rank",
        "orch config -H hostfile --launcher standard -o configs",
    ),
)
def config_command(
    hostfile: Annotated[
        Path | None,
        typer.Option(
            "--hostfile",
            "-H",
            help="DeepSpeed hostfile (or -w with --slots). Default: ORCH_HOSTFILE, else a "
            "defaults file's.",
        ),
    ] = None,
    nodes: str | None = nodelist_option("Node set instead of a hostfile."),
    slots: int | None = typer.Option(None, "--slots", help="Slots per node with -w."),
    recipe_path: Annotated[
        Path | None,
        typer.Option("--recipe", help="Take launcher, options and hosts from this recipe."),
    ] = None,
    launcher: str | None = typer.Option(
        None,
        "--launcher",
        "-l",
        help="pdsh (one config; also spelled deepspeed) or standard (one per machine rank; "
        "also spelled accelerate). Default: the recipe's, else a defaults file's, else pdsh.",
        **one_of(CONFIG_LAUNCHERS),
    ),
    nproc_per_node: int | None = typer.Option(
        None, "--nproc-per-node", help="Processes per node (default: the hostfile's slots)."
    ),
    # accelerate's num_processes: the total, split evenly over the machines (hidden: one
    # spelling per concept is --nproc-per-node; this one maps to it exactly here).
    num_processes: int | None = typer.Option(None, "--num-processes", hidden=True),
    main_address: str | None = typer.Option(
        None, "--main-address", help="Main process address (default: the first host)."
    ),
    main_port: int | None = typer.Option(None, "--main-port", help="Main process port."),
    distributed_type: str | None = typer.Option(
        None, "--distributed-type", help="Default: DEEPSPEED.", **_choices("distributed_type")
    ),
    zero_stage: int | None = typer.Option(
        None, "--zero-stage", help="DeepSpeed ZeRO stage.", min=0, max=3, **one_of(range(4))
    ),
    offload_optimizer: str | None = typer.Option(
        None,
        "--offload-optimizer",
        help="Where ZeRO keeps the optimizer state.",
        **_choices("offload_optimizer_device"),
    ),
    offload_param: str | None = typer.Option(
        None,
        "--offload-param",
        help="Where ZeRO-3 keeps the parameters.",
        **_choices("offload_param_device"),
    ),
    gradient_accumulation: int | None = typer.Option(
        None, "--gradient-accumulation-steps", help="Gradient accumulation steps."
    ),
    gradient_clipping: float | None = typer.Option(
        None, "--gradient-clipping", help="Gradient clipping value."
    ),
    mixed_precision: str | None = typer.Option(
        None, "--mixed-precision", help="Default: no.", **_choices("mixed_precision")
    ),
    rdzv_backend: str | None = typer.Option(
        None, "--rdzv-backend", help="Default: static.", **_choices("rdzv_backend")
    ),
    dynamo_backend: str | None = typer.Option(
        None, "--dynamo-backend", help="torch.compile backend, e.g. INDUCTOR."
    ),
    out_dir: Annotated[
        Path, typer.Option("--output", "-o", help="Directory to write the config(s) into.")
    ] = Path("."),
) -> None:
    """Write the accelerate config for the pdsh launcher, or one per machine rank (standard).

    Exit codes: 0 written; 2 a usage error (a bad hostfile, recipe or value)."""
    given = {
        "distributed_type": distributed_type,
        "zero_stage": zero_stage,
        "offload_optimizer_device": offload_optimizer,
        "offload_param_device": offload_param,
        "gradient_accumulation_steps": gradient_accumulation,
        "gradient_clipping": gradient_clipping,
        "mixed_precision": mixed_precision,
        "rdzv_backend": rdzv_backend,
        "dynamo": {"backend": dynamo_backend} if dynamo_backend else None,
    }
    given = {key: value for key, value in given.items() if value is not None}
    recipe = load_recipe(recipe_path) if recipe_path is not None else None
    if recipe is not None and given:
        raise UsageError(
            f"--recipe sets the accelerate options; drop --{next(iter(given)).replace('_', '-')}",
            hint=f"edit {recipe_path} instead",
        )
    options = recipe.accelerate if recipe is not None else accelerate_options(**given)
    said: list[str] = []
    defaults = read_defaults()
    hostfile = default_hostfile(defaults, hostfile, nodelist=nodes, recipe=recipe, said=said)
    launcher = default_launcher(defaults, launcher, recipe=recipe, allowed=CONFIG_LAUNCHERS,
                                said=said)  # fmt: skip
    say_defaults(said)
    chosen_launcher = _config_launcher(launcher, recipe)
    hosts, hostfile_path = _config_hosts(hostfile, nodes, slots, recipe, out_dir, chosen_launcher)
    nproc = _config_nproc(hosts, nproc_per_node, num_processes, recipe)
    recipe_port = (recipe.main_port if recipe else None) or DEFAULT_MAIN_PORT
    port = main_port if main_port is not None else recipe_port
    written = _render_and_write(
        options, hosts, nproc, main_address or hosts.names[0], port, chosen_launcher,
        hostfile_path, out_dir,
    )  # fmt: skip
    for path in written:
        typer.echo(str(path))


def _config_launcher(launcher: str | None, recipe: Recipe | None) -> str:
    chosen = launcher_named(launcher) if launcher else (recipe.launcher if recipe else "pdsh")
    if chosen not in CONFIG_LAUNCHERS:
        raise UsageError(
            f"launcher {chosen!r} takes no accelerate config",
            hint="accelerate configs are for --launcher pdsh or standard",
        )
    return chosen


def _config_hosts(
    hostfile: Path | None,
    nodes: str | None,
    slots: int | None,
    recipe: Recipe | None,
    out_dir: Path,
    launcher: str,
) -> tuple[Hostfile, str | None]:
    """The hosts, and the hostfile path the pdsh config points at (written if needed)."""
    if hostfile is not None and nodes is not None:
        raise UsageError("give --hostfile or -w/--nodelist, not both")
    if hostfile is not None:
        return read_hostfile(hostfile), str(hostfile.resolve())
    if nodes is not None:
        if slots is None:
            raise UsageError("-w/--nodelist needs --slots N")
        hosts = make_hostfile(expand_nodeset(nodes), _parse_slots(str(slots)))
    elif recipe is not None and recipe.hostfile is not None:
        path = Path(recipe.hostfile)
        return read_hostfile(path), str(path.resolve())
    elif recipe is not None and recipe.nodelist is not None:
        hosts = recipe_hosts(recipe)
    else:
        raise UsageError(
            "no hosts: give --hostfile FILE or -w NODESET --slots N",
            hint="write a hostfile with `orch hostfile -w 'gpu[01-04]' --slots 8 -o hostfile`",
        )
    if launcher != "pdsh":
        return hosts, None
    # The pdsh config names a hostfile: write the one these hosts make beside it.
    return hosts, str((out_dir / HOSTFILE_NAME).resolve())


def _config_nproc(
    hosts: Hostfile, nproc_per_node: int | None, num_processes: int | None, recipe: Recipe | None
) -> int:
    if nproc_per_node is not None and num_processes is not None:
        raise UsageError("give --nproc-per-node or --num-processes (the total), not both")
    if num_processes is not None:
        nproc_per_node = nproc_from_total(num_processes, len(hosts.hosts))
    elif nproc_per_node is None and recipe is not None:
        nproc_per_node = recipe.nproc_per_node
    return processes_per_node(hosts, nproc_per_node)


def _render_and_write(
    options: AccelerateOptions,
    hosts: Hostfile,
    nproc: int,
    main_ip: str,
    main_port: int,
    launcher: str,
    hostfile_path: str | None,
    out_dir: Path,
) -> list[Path]:
    """Render everything first (so a bad value writes nothing), then write."""
    common = {
        "hosts": hosts, "nproc_per_node": nproc, "main_ip": main_ip, "main_port": main_port,
    }  # fmt: skip
    files: dict[Path, str] = {}
    if launcher == "pdsh":
        assert hostfile_path is not None
        text = render_accelerate_config(
            options, launcher="pdsh", hostfile_path=hostfile_path, **common
        )
        if hosts.source in (None, NODESET_SOURCE):
            # Hosts from a node set: the hostfile the config names is written here too.
            files[Path(hostfile_path)] = render_hostfile(hosts)
        files[out_dir / PDSH_CONFIG_NAME] = text
    else:
        for rank, text in enumerate(render_standard_configs(options, **common)):
            files[out_dir / standard_config_name(rank)] = text
    for path, text in files.items():
        _write(path, text)
    return [path.resolve() for path in files]


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise OrchError(f"{path}: cannot write: {err.strerror}") from None
