"""`orch version`: orch's version and every version a bug report needs."""

from __future__ import annotations

import typer

from orchestrator.cli.about.versions import collect_versions, versions_text
from orchestrator.cli.app import app, report_versions_with
from orchestrator.cli.documents import print_document
from orchestrator.cli.options import examples


@app.command("version", epilog=examples("orch version", "orch version --json"))
def version(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Print the versions a bug report needs.

    orch's, and those of Python, the platform, torch, DeepSpeed, accelerate, paramiko,
    ClusterShell, pdsh and Slurm (programs get 5 s to answer; "not found" when absent).

    Exit codes: 0 (a version that cannot be read shows as such)."""
    versions = collect_versions()
    if as_json:
        print_document("version", versions.to_json())
        return
    typer.echo(versions_text(versions))


def _report() -> str:
    return versions_text(collect_versions())


report_versions_with(_report)  # `orch --version` prints the same
