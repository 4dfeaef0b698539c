"""`orch sandbox up | down | status`: the loopback cluster."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.cli.app import app
from orchestrator.sandbox import Sandbox

sandbox_app = typer.Typer(help="A cluster of real OpenSSH nodes on loopback addresses.")
app.add_typer(sandbox_app, name="sandbox")

_DIR_OPTION = typer.Option(
    None,
    "--dir",
    help="State directory (default: $ORCH_SANDBOX_DIR or ~/.local/state/orch/sandbox).",
)


@sandbox_app.command("up")
def up(
    nodes: int = typer.Option(4, "--nodes", "-n", min=1, max=250, help="Number of nodes."),
    slots: int = typer.Option(2, "--slots", min=1, help="Slots (ranks) per node in the hostfile."),
    prefix: str = typer.Option("node", "--prefix", help="Node names are PREFIX1..PREFIXN."),
    sshd: str = typer.Option(
        "default", "--sshd", help="sshd profile: default, or hardened (no SFTP, default limits)."
    ),
    directory: Path | None = _DIR_OPTION,
) -> None:
    """Start the nodes (or keep them if already up) and print the hostfile path."""
    state = Sandbox(directory).up(nodes=nodes, slots=slots, prefix=prefix, sshd_profile=sshd)
    err = Console(stderr=True, highlight=False)
    first, last = state.nodes[0], state.nodes[-1]
    err.print(
        f"sandbox up: {len(state.nodes)} nodes {first.name}..{last.name} on "
        f"{first.address}..{last.address} port {first.port}"
        + ("" if state.namespaces else " (no namespaces: nodes share this hostname)")
        + ("" if state.sshd_profile == "default" else f", sshd {state.sshd_profile}")
    )
    # stdout carries only the path, so `HF=$(orch sandbox up)` works.
    typer.echo(state.hostfile)


@sandbox_app.command("down")
def down(directory: Path | None = _DIR_OPTION) -> None:
    """Stop every process of every node and remove what `up` added."""
    state = Sandbox(directory).down()
    msg = "sandbox down" if state else "no sandbox was up"
    Console(stderr=True, highlight=False).print(msg)


@sandbox_app.command("status")
def status(
    directory: Path | None = _DIR_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Show each node: address, process, port."""
    box = Sandbox(directory)
    state = box.load()
    rows = box.status(state)
    if as_json:
        doc = {
            "up": state is not None,
            "directory": str(box.directory),
            "hostfile": state.hostfile if state else None,
            "namespaces": state.namespaces if state else None,
            "nodes": [row.__dict__ for row in rows],
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    console = Console(highlight=False)
    if state is None:
        console.print(f"no sandbox is up ({box.directory})")
        return
    table = Table(title=f"sandbox {box.directory}")
    for col in ("node", "address", "port", "process", "sshd"):
        table.add_column(col)
    for row in rows:
        table.add_row(
            row.name,
            row.address,
            str(row.port),
            "running" if row.process_alive else "[red]dead[/]",
            "listening" if row.port_open else "[red]closed[/]",
        )
    console.print(table)
    console.print(f"hostfile: {state.hostfile}")
