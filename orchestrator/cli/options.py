"""Option definitions several commands share, so each reads and behaves the same everywhere."""

from __future__ import annotations

import typer

INCLUDE = typer.Option(
    None,
    "--include",
    help="Only these nodes (and slots), DeepSpeed's syntax: 'node1:0,1@node2' or 'gpu[03-04]'.",
)
EXCLUDE = typer.Option(
    None, "--exclude", help="Leave these nodes (or slots) out, DeepSpeed's syntax: 'gpu02'."
)
SLURM = typer.Option(
    False,
    "--slurm",
    help="Take the nodes and ranks per node from the Slurm allocation this runs in "
    "(SLURM_JOB_ID, SLURM_JOB_NODELIST), not a hostfile. Implied inside one with no --hostfile.",
)
TRANSPORT = typer.Option(
    None,
    "--transport",
    help="How orch reaches the nodes for its own commands: ssh, or slurm (srun steps, inside "
    "an allocation whose nodes refuse SSH). Default: ssh, unless the allocation's first node "
    "refuses it.",
)
