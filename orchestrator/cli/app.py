"""The typer app every command group registers on. Imports no command module, so the
command modules and the entry point (cli/main.py) can both import it without a cycle."""

from __future__ import annotations

import typer

from orchestrator import __version__

app = typer.Typer(
    name="orch",
    help="pdsh-driven orchestrator for multi-node training: doctor, configs, launch, logs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_options = {"debug": False}


def debug_requested() -> bool:
    """Whether `--debug` was given: orch's own errors then come with their traceback."""
    return _options["debug"]


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
    _options["debug"] = debug
