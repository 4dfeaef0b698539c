"""The `orch` entry point: builds the typer app and turns OrchError into one clear line."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from orchestrator import __version__
from orchestrator.errors import OrchError

app = typer.Typer(
    name="orch",
    help="pdsh-driven orchestrator for multi-node training: doctor, configs, launch, logs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_state = {"debug": False}


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"orch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for orch's own errors."),
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version."
    ),
) -> None:
    _state["debug"] = debug


def _register_commands() -> None:
    # Each command group lives in its own module; importing it registers its commands.
    from orchestrator.cli import (  # noqa: F401
        doctor_cmds,
        files_cmds,
        job_cmds,
        logs_cmds,
        sandbox_cmds,
    )


def main(argv: list[str] | None = None) -> None:
    _register_commands()
    try:
        # Standalone mode: click handles usage errors (exit 2) and typer.Exit itself;
        # orch's own errors come through to here.
        app(args=argv, prog_name="orch")
    except OrchError as err:
        stderr = Console(stderr=True, highlight=False)
        if _state["debug"]:
            stderr.print_exception()
        stderr.print(f"[bold red]error:[/] {err.message}", markup=True, soft_wrap=True)
        if err.hint:
            stderr.print(f"[yellow]hint:[/] {err.hint}", soft_wrap=True)
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
