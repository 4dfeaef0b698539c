"""Doctor's findings inside a Slurm allocation. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from orchestrator.checks.model import Finding


def ssh_inside_allocation(findings: Sequence[Finding], slurm_job: str) -> tuple[Finding, ...]:
    """Inside an allocation srun reaches every node, but orch still needs SSH to them (the
    job's settings, node 0's port, the raw logs, stacks): an SSH failure says so, and how
    clusters allow it."""
    note = (
        f"inside Slurm job {slurm_job}, srun reaches this node: `--transport slurm` checks it "
        "through srun steps (launch still needs SSH for now); clusters with pam_slurm_adopt "
        "allow SSH to the nodes of your own allocation"
    )
    return tuple(
        replace(f, fix=f"{f.fix}; {note}") if f.check == "ssh" and f.severity == "error" else f
        for f in findings
    )
