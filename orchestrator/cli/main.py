"""The `orch` entry point: builds the typer app and turns OrchError into one clear line."""

from __future__ import annotations

import sys

import click
import typer
from rich.console import Console

from orchestrator.errors import OrchError

app = typer.Typer(
    name="orch",
    help="pdsh-driven orchestrator for multi-node training: doctor, configs, launch, logs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_state = {"debug": False}


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for orch's own errors."),
) -> None:
    _state["debug"] = debug


def _register_commands() -> None:
    # Each area owns one module; importing it registers its commands on `app`.
    from orchestrator.cli import (  # noqa: F401
        doctor_cmds,
        files_cmds,
        job_cmds,
        sandbox_cmds,
    )


def main(argv: list[str] | None = None) -> None:
    _register_commands()
    stderr = Console(stderr=True, highlight=False)
    try:
        app(args=argv, standalone_mode=False)
    except OrchError as err:
        if _state["debug"] or "--debug" in (argv if argv is not None else sys.argv):
            stderr.print_exception()
        stderr.print(f"[bold red]error:[/] {err.message}", markup=True, soft_wrap=True)
        if err.hint:
            stderr.print(f"[yellow]hint:[/] {err.hint}", soft_wrap=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        stderr.print("aborted")
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(2 if isinstance(err, click.UsageError) else err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
