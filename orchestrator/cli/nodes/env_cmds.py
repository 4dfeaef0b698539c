"""`orch env push`: make every node's environment at the head's path the head's."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.cli.app import app
from orchestrator.cli.documents import print_document
from orchestrator.cli.options import EXCLUDE, INCLUDE, SLURM, TRANSPORT, examples
from orchestrator.cli.user_defaults import (
    default_hostfile,
    default_python,
    read_defaults,
    say_defaults,
)
from orchestrator.specs.inventory import filter_hosts, read_hostfile
from orchestrator.specs.slurm import job_inventory
from orchestrator.specs.units import format_bytes

env_app = typer.Typer(help="The job's Python environment on every node.")
app.add_typer(env_app, name="env")
_HOSTFILE = typer.Option(
    None,
    "--hostfile",
    "-H",
    help="DeepSpeed hostfile (`host slots=N`; default: ORCH_HOSTFILE, else a defaults file's).",
)


@env_app.command(
    "push",
    epilog=examples(
        "orch env push -H hostfile --python /opt/venv/bin/python --dry-run",
        "orch env push -H hostfile --python /opt/venv/bin/python",
    ),
)
def push(
    hostfile: Path | None = _HOSTFILE,
    slurm: bool = SLURM,
    python: str | None = typer.Option(
        None,
        "--python",
        help="Interpreter of the environment to push (venv or conda). Default: a defaults "
        "file's, else the head's.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say per node what would be sent."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    force: bool = typer.Option(
        False, "--force", help="Push even where processes run from the environment."
    ),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds for a node to answer."),
    include: str | None = INCLUDE,
    exclude: str | None = EXCLUDE,
    transport_name: str | None = TRANSPORT,
) -> None:
    """Make every node's environment at the --python's path the head's.

    Only what differs is sent, once, passed from node to node; each node switches to it in
    one rename. Nodes as doctor takes them (--hostfile, or inside a Slurm allocation).

    Exit codes: 0 every node has the head's environment (or, --dry-run, could); 1 a node
    failed; 2 a usage error; 130/143 interrupted (no node is left half-switched)."""
    from orchestrator.envpush.push import environment_source, push_environment
    from orchestrator.errors import OrchError
    from orchestrator.nodes.transport import choose_transport
    from orchestrator.prepare.preflight import head_environment

    said: list[str] = []
    defaults = read_defaults()
    hostfile = default_hostfile(defaults, hostfile, slurm=slurm, said=said)
    python = default_python(defaults, python, said=said) or sys.executable
    say_defaults(said)
    source = environment_source(python)
    head_env = head_environment(source.python)
    if head_env is None:
        raise OrchError(
            f"{source.python} does not run on the head",
            "check the environment with `--python ... -c 'import sys'`",
        )
    given = read_hostfile(hostfile) if hostfile is not None else None
    inventory, allocation = job_inventory(given, slurm=slurm, environ=os.environ)
    hosts = filter_hosts(inventory, include=include, exclude=exclude)
    transport = choose_transport(
        transport_name, slurm_job=allocation.job_id if allocation else "",
        first_node=hosts.names[0] if hosts.names else "",
        say=lambda line: typer.echo(line, err=True),
    )  # fmt: skip
    try:
        with _progress(quiet=as_json) as (on_bytes, on_node, on_send):
            report = _until_interrupted(lambda: push_environment(
                hosts.names, source, head_env, transport=transport, dry_run=dry_run,
                force=force, timeout=timeout, on_bytes=on_bytes, on_node=on_node,
                on_send=on_send,
            ))  # fmt: skip
    except _Interrupted as stopped:
        sys.stderr.write(f"interrupted ({stopped}): no node switched to a half-sent "
                         "environment; each keeps the one it had (or the new one, if it had "
                         "switched)\n")  # fmt: skip
        sys.stderr.flush()
        os._exit(128 + stopped.signum)  # the push's threads wait for nodes; channels close
    doc = report.to_dict()
    if as_json:
        print_document("env-push", doc)
    else:
        _print(doc, dry_run)
    raise typer.Exit(0 if doc["ok"] else 1)


T = TypeVar("T")


class _Interrupted(Exception):
    """Ctrl-C (SIGINT) or SIGTERM during the push."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _until_interrupted(work: Callable[[], T]) -> T:
    """`work` in a thread of its own, so that Ctrl-C or SIGTERM ends the push at once: the
    process exits, every node's channel closes, and each node drops what it was building
    and keeps its previous environment (its threads would otherwise wait for the nodes).
    The handlers are orch's own: a SIGINT ignored since start-up (a job started in the
    background by a shell) still stops it."""
    done: dict[str, Any] = {}
    stop: list[int] = []

    def run() -> None:
        try:
            done["value"] = work()
        except BaseException as err:  # handed to the main thread as it is
            done["error"] = err

    previous = {sig: signal.signal(sig, lambda signum, _frame: stop.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}  # fmt: skip
    try:
        worker = threading.Thread(target=run, name="env-push", daemon=True)
        worker.start()
        while worker.is_alive() and not stop:
            worker.join(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop:
        raise _Interrupted(stop[0])
    if "error" in done:
        raise done["error"]
    return done["value"]


class _progress:
    """A bar of bytes sent and nodes done, on a terminal only."""

    def __init__(self, quiet: bool) -> None:
        self.show = not quiet and sys.stderr.isatty()
        self.lock = threading.Lock()
        self.done = 0

    def __enter__(self):  # type: ignore[no-untyped-def]
        if not self.show:
            return None, None, None
        columns = (
            TextColumn("pushing"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TextColumn("{task.fields[nodes]} node(s) done"),
            TimeElapsedColumn(),
        )
        self.bar = Progress(*columns, console=Console(stderr=True), transient=True)
        self.bar.__enter__()
        self.task = self.bar.add_task("push", total=None, nodes=0)
        return self._bytes, self._node, self._total

    def _total(self, count: int) -> None:
        with self.lock:
            self.bar.update(self.task, total=count)

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
    verb = "would receive" if dry_run else "received"
    for node in doc["nodes"]:
        if not node["ok"]:
            console.print(f"[red]{node['problem']}[/]\n  fix: {node['fix']}")
        elif node["shared"]:
            console.print(
                f"{node['node']}: sees the head's {doc['root']} (shared filesystem): left alone"
            )
        else:
            came = node.get("from")
            came = f" from {'the head' if came == 'head' else came}" if came else ""
            console.print(
                f"{node['node']}: {verb} {node['sent_files']} file(s) "
                f"({format_bytes(node['sent_bytes'])}){came}; removed "
                f"{node['removed_files']}; fingerprint {node['fingerprint'] or '-'}"
            )
    ok = sum(1 for n in doc["nodes"] if n["ok"])
    console.print(
        f"{doc['root']} ({format_bytes(doc['payload_bytes'])}, fingerprint "
        f"{doc['fingerprint']}): {ok}/{len(doc['nodes'])} node(s) "
        f"{'checked' if dry_run else 'up to date'}; the head sent "
        f"{format_bytes(doc['head_sent_bytes'])}"
    )
    if os.environ.get("ORCH_DEBUG"):
        console.print(doc)
