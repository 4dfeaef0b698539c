"""`orch env push`: make every node's environment at the head's path the head's."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.cli.app import app
from orchestrator.cli.options import EXCLUDE, INCLUDE, SLURM
from orchestrator.specs.inventory import filter_hosts, read_hostfile
from orchestrator.specs.slurm import job_inventory

env_app = typer.Typer(help="The job's Python environment on every node.")
app.add_typer(env_app, name="env")
_HOSTFILE = typer.Option(None, "--hostfile", "-H", help="DeepSpeed hostfile (`host slots=N`).")


@env_app.command("push")
def push(
    hostfile: Path | None = _HOSTFILE,
    slurm: bool = SLURM,
    python: str = typer.Option(
        sys.executable, "--python", help="Interpreter of the environment to push (venv or conda)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say per node what would be sent."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    force: bool = typer.Option(
        False, "--force", help="Push even where processes run from the environment."
    ),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds for a node to answer."),
    include: str | None = INCLUDE,
    exclude: str | None = EXCLUDE,
) -> None:
    """Make every node's environment at PATH the head's: only what differs is sent, and
    each node switches to it in one rename. Nodes as doctor takes them (--hostfile, or
    inside a Slurm allocation), reached over SSH."""
    from orchestrator.errors import OrchError
    from orchestrator.run.envpush import environment_source, push_environment
    from orchestrator.run.preflight import head_environment

    source = environment_source(python)
    head_env = head_environment(source.python)
    if head_env is None:
        raise OrchError(
            f"{source.python} does not run on the head",
            "check the environment with `--python ... -c 'import sys'`",
        )
    given = read_hostfile(hostfile) if hostfile is not None else None
    inventory, _ = job_inventory(given, slurm=slurm, environ=os.environ)
    hosts = filter_hosts(inventory, include=include, exclude=exclude)
    with _progress(quiet=as_json) as (on_bytes, on_node):
        report = push_environment(
            hosts.names,
            source,
            head_env,
            dry_run=dry_run,
            force=force,
            timeout=timeout,
            on_bytes=on_bytes,
            on_node=on_node,
        )
    doc = report.to_dict()
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        _print(doc, dry_run)
    raise typer.Exit(0 if doc["ok"] else 1)


class _progress:
    """A bar of bytes sent and nodes done, on a terminal only."""

    def __init__(self, quiet: bool) -> None:
        self.show = not quiet and sys.stderr.isatty()
        self.lock = threading.Lock()
        self.done = 0

    def __enter__(self):  # type: ignore[no-untyped-def]
        if not self.show:
            return None, None
        columns = (
            TextColumn("pushing"),
            BarColumn(),
            DownloadColumn(),
            TextColumn("{task.fields[nodes]} node(s) done"),
            TimeElapsedColumn(),
        )
        self.bar = Progress(*columns, console=Console(stderr=True), transient=True)
        self.bar.__enter__()
        self.task = self.bar.add_task("push", total=None, nodes=0)
        return self._bytes, self._node

    def _bytes(self, _node: str, count: int) -> None:
        with self.lock:
            self.bar.update(self.task, advance=count)

    def _node(self, _result: object) -> None:
        with self.lock:
            self.done += 1
            self.bar.update(self.task, nodes=self.done)

    def __exit__(self, *exc: object) -> None:
        if self.show:
            self.bar.__exit__(None, None, None)


def _print(doc: dict, dry_run: bool) -> None:
    console = Console(highlight=False)
    verb = "would send" if dry_run else "sent"
    for node in doc["nodes"]:
        if not node["ok"]:
            console.print(f"[red]{node['node']}[/]: {node['problem']}\n  fix: {node['fix']}")
        elif node["shared"]:
            console.print(
                f"{node['node']}: sees the head's {doc['root']} (shared filesystem): left alone"
            )
        else:
            console.print(
                f"{node['node']}: {verb} {node['sent_files']} file(s), "
                f"{node['sent_bytes'] / 2**20:.1f} MiB; removed "
                f"{node['removed_files']}; fingerprint {node['fingerprint'] or '-'}"
            )
    ok = sum(1 for n in doc["nodes"] if n["ok"])
    console.print(
        f"{doc['root']} ({doc['payload_bytes'] / 2**20:.0f} MiB, fingerprint "
        f"{doc['fingerprint']}): {ok}/{len(doc['nodes'])} node(s) "
        f"{'checked' if dry_run else 'up to date'}; the head sent "
        f"{doc['head_sent_bytes'] / 2**20:.1f} MiB"
    )
    if os.environ.get("ORCH_DEBUG"):
        console.print(doc)
