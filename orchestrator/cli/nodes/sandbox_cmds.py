"""`orch sandbox up | down | status`: the loopback cluster."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.cli.app import app
from orchestrator.cli.documents import print_document
from orchestrator.cli.options import examples, nodes_option, one_of
from orchestrator.errors import UsageError
from orchestrator.sandbox.cluster import Sandbox
from orchestrator.sandbox.render import SSHD_PROFILES
from orchestrator.sandbox.slurm import PARTITION, URGENT_PARTITION

sandbox_app = typer.Typer(help="A cluster of real OpenSSH nodes on loopback addresses.")
app.add_typer(sandbox_app, name="sandbox")

_DIR_OPTION = typer.Option(
    None,
    "--dir",
    help="State directory (default: $ORCH_SANDBOX_DIR or ~/.local/state/orch/sandbox).",
)


_PRIVATE_OPTION = typer.Option(
    [],
    "--private",
    metavar="DIR",
    help="An existing directory each node gets its own empty copy of (its local disk: "
    "neither the head nor another node sees what it writes there); repeatable.",
)
_GUEST_OPTION = typer.Option(
    [],
    "--guest",
    metavar="USER",
    help="As root: the nodes also accept this account with its own key "
    "(~USER/.ssh/id_ed25519), which gets a client configuration of its own; repeatable. "
    "Several ordinary users then share the nodes, as on a real cluster.",
)


@sandbox_app.command(
    "up",
    epilog=examples(
        "orch sandbox up -N 4",
        "orch sandbox up -N 2 --slurm",
    ),
)
def up(
    nodes: int = nodes_option("Number of nodes.", 4, most=250, nodelist=False),
    slots: int = typer.Option(2, "--slots", min=1, help="Slots (ranks) per node in the hostfile."),
    prefix: str = typer.Option("node", "--prefix", help="Node names are PREFIX1..PREFIXN."),
    sshd: str = typer.Option(
        "default",
        "--sshd",
        help="sshd profile: default, or hardened (no SFTP, default limits).",
        **one_of(SSHD_PROFILES),
    ),
    no_ssh: bool = typer.Option(
        False,
        "--no-ssh",
        help="With --slurm: nodes refuse every SSH login, as compute nodes "
        "of clusters that allow only Slurm into them (the sshd profile no-ssh).",
    ),
    slurm: bool = typer.Option(
        False,
        "--slurm",
        help="Also run a real Slurm over the nodes (slurmctld here, a slurmd "
        "on each node, one partition); clients need the SLURM_CONF it prints.",
    ),
    shared_pids: bool = typer.Option(
        False,
        "--shared-pids",
        help="The nodes share this machine's process table (one PID namespace), as "
        "several hostfile entries on one machine would; each keeps its own hostname.",
    ),
    guest: list[str] = _GUEST_OPTION,
    private: list[Path] = _PRIVATE_OPTION,
    directory: Path | None = _DIR_OPTION,
) -> None:
    """Start the nodes (or keep them if already up) and print the hostfile path.

    Exit codes: 0 up; 1 the nodes could not be brought up; 2 a usage error."""
    if no_ssh:
        if not slurm or sshd not in ("default", "no-ssh"):
            raise UsageError(
                "--no-ssh goes with --slurm and no other --sshd profile",
                "nodes that refuse SSH are reached through Slurm: add --slurm",
            )
        sshd = "no-ssh"
    box = Sandbox(directory)
    state = box.up(nodes=nodes, slots=slots, prefix=prefix, sshd_profile=sshd, slurm=slurm,
                   shared_pids=shared_pids, guest_users=tuple(guest))  # fmt: skip
    for path in private:
        for node in state.nodes:
            box.private_directory(node.name, path.resolve())
    err = Console(stderr=True, highlight=False)
    first, last = state.nodes[0], state.nodes[-1]
    err.print(
        f"sandbox up: {len(state.nodes)} nodes {first.name}..{last.name} on "
        f"{first.address}..{last.address} port {first.port}"
        + ("" if state.namespaces else " (no namespaces: nodes share this hostname)")
        + (" (nodes share one process table)" if state.namespaces and state.shared_pids else "")
        + ("" if state.sshd_profile == "default" else f", sshd {state.sshd_profile}")
    )
    if state.slurm_conf:
        err.print(
            f"slurm: partition {PARTITION}, {len(state.nodes)} nodes x {state.slots} CPUs "
            f"({URGENT_PARTITION}'s jobs preempt its own); "
            f"for srun/salloc/sbatch: export SLURM_CONF={state.slurm_conf}"
        )
    # stdout carries only the path, so `HF=$(orch sandbox up)` works.
    typer.echo(state.hostfile)


@sandbox_app.command(
    "down",
    epilog=examples(
        "orch sandbox down",
    ),
)
def down(directory: Path | None = _DIR_OPTION) -> None:
    """Stop every process of every node and remove what `up` added.

    Exit codes: 0 down (or none was up); 1 orch's own failure."""
    state = Sandbox(directory).down()
    msg = "sandbox down" if state else "no sandbox was up"
    Console(stderr=True, highlight=False).print(msg)


@sandbox_app.command(
    "status",
    epilog=examples(
        "orch sandbox status",
    ),
)
def status(
    directory: Path | None = _DIR_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Show each node: address, process, port.

    Exit codes: 0 shown (or none is up, which it says)."""
    box = Sandbox(directory)
    state = box.load()
    rows = box.status(state)
    slurm_states = box.slurm_states(state) if state else {}
    if as_json:
        doc = {
            "up": state is not None,
            "directory": str(box.directory),
            "hostfile": state.hostfile if state else None,
            "namespaces": state.namespaces if state else None,
            "shared_pids": state.shared_pids if state else None,
            "nodes": [row.__dict__ for row in rows],
            "slurm": {"conf": state.slurm_conf, "nodes": slurm_states}
            if state and state.slurm_conf
            else None,
        }
        print_document("sandbox", doc)
        return
    console = Console(highlight=False)
    if state is None:
        console.print(f"no sandbox is up ({box.directory})")
        return
    table = Table(title=f"sandbox {box.directory}")
    columns = ("node", "address", "port", "process", "sshd")
    for col in (*columns, "slurmd") if state.slurm_conf else columns:
        table.add_column(col)
    for row in rows:
        cells = [
            row.name,
            row.address,
            str(row.port),
            "running" if row.process_alive else "[red]dead[/]",
            "listening" if row.port_open else "[red]closed[/]",
        ]
        if state.slurm_conf:
            cells.append(slurm_states.get(row.name, "[red]no answer[/]"))
        table.add_row(*cells)
    console.print(table)
    console.print(f"hostfile: {state.hostfile}")
    if state.slurm_conf:
        console.print(f"slurm: partition {PARTITION}; export SLURM_CONF={state.slurm_conf}")
