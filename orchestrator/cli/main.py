"""The `orch` entry point: registers every command group and turns OrchError into one
clear line with a hint (a traceback only with --debug)."""

from __future__ import annotations

import sys

from rich.console import Console

from orchestrator.cli import (
    doctor_cmds,
    env_cmds,
    files_cmds,
    job_cmds,
    logs_cmds,
    report_cmds,
    sandbox_cmds,
    stacks_cmds,
    stop_cmds,
    version_cmds,
)

# isort: split
# Commands are listed (`orch --help`, docs/reference/cli.md) in the order their modules are
# first imported: this one comes last, so a module of the above imported first (as a test
# may) leaves the order as it is.
from orchestrator.cli import checkpoints_cmds
from orchestrator.cli.app import app, debug_requested
from orchestrator.errors import OrchError

# Importing a command module registers its commands on `app`.
COMMAND_GROUPS = (
    doctor_cmds, env_cmds, files_cmds, job_cmds, logs_cmds, report_cmds, sandbox_cmds, stacks_cmds,
    stop_cmds, version_cmds, checkpoints_cmds,
)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    try:
        # Standalone mode: click handles usage errors (exit 2) and typer.Exit itself;
        # orch's own errors come through to here.
        app(args=argv, prog_name="orch")
    except OrchError as err:
        stderr = Console(stderr=True, highlight=False)
        if debug_requested():
            stderr.print_exception()
        stderr.print(f"[bold red]error:[/] {err.message}", markup=True, soft_wrap=True)
        if err.hint:
            stderr.print(f"[yellow]hint:[/] {err.hint}", soft_wrap=True)
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
