"""The `orch` entry point: registers every command group and turns OrchError into one
clear line with a hint (a traceback only with --debug)."""

from __future__ import annotations

import sys

from rich.console import Console

# isort: off
# Commands are listed (`orch --help`, docs/reference/cli.md) in the order their modules are
# first imported: this order, unless a test imported one of them first.
from orchestrator.cli.nodes import doctor_cmds, env_cmds, files_cmds
from orchestrator.cli.jobs import job_cmds, logs_cmds, report_cmds
from orchestrator.cli.nodes import sandbox_cmds
from orchestrator.cli.jobs import stacks_cmds, stop_cmds
from orchestrator.cli.about import version_cmds
from orchestrator.cli.jobs import checkpoints_cmds
# isort: on
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
