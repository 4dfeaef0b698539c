"""The `orch` entry point: registers the command groups and turns OrchError into one clear
line with a hint (a traceback only with --debug).

`orch NAME ...` imports only the module of command NAME: a command pays for the libraries
it uses (`orch status` needs no SSH), which keeps every command and shell completion quick.
Help, completion and a name orch does not know register them all."""

from __future__ import annotations

import importlib
import os
import sys

from rich.console import Console

from orchestrator.cli.app import app, debug_requested
from orchestrator.errors import OrchError

# Every command's module (a module registers its commands on `app` when first imported), in
# the order `orch --help` and docs/reference/cli.md list them.
COMMAND_MODULES: dict[str, str] = {
    "doctor": "orchestrator.cli.nodes.doctor_cmds",
    "env": "orchestrator.cli.nodes.env_cmds",
    "hostfile": "orchestrator.cli.nodes.files_cmds",
    "config": "orchestrator.cli.nodes.files_cmds",
    "launch": "orchestrator.cli.jobs.job_cmds",
    "submit": "orchestrator.cli.jobs.job_cmds",
    "status": "orchestrator.cli.jobs.status_cmds",
    "kill": "orchestrator.cli.jobs.status_cmds",
    "logs": "orchestrator.cli.jobs.logs_cmds",
    "report": "orchestrator.cli.jobs.report_cmds",
    "sandbox": "orchestrator.cli.nodes.sandbox_cmds",
    "stacks": "orchestrator.cli.jobs.stacks_cmds",
    "stop": "orchestrator.cli.jobs.stop_cmds",
    "version": "orchestrator.cli.about.version_cmds",
    "checkpoints": "orchestrator.cli.jobs.checkpoints_cmds",
}
_COMPLETION = "_ORCH_COMPLETE"  # set by the shell when it asks for completions


def register(argv: list[str] | None = None) -> None:
    """Register the commands `orch ARGV` can reach: the named command's module, or all."""
    argv = sys.argv[1:] if argv is None else argv
    # The root's options take no value, so the first word that is no option is the command.
    name = next((word for word in argv if not word.startswith("-")), None)
    if name in COMMAND_MODULES and _COMPLETION not in os.environ:
        importlib.import_module(COMMAND_MODULES[name])
    else:
        register_all()


def register_all() -> None:
    """Every command, listed in COMMAND_MODULES' order whichever was imported first."""
    for module in dict.fromkeys(COMMAND_MODULES.values()):
        importlib.import_module(module)
    order = list(COMMAND_MODULES)
    app.registered_commands.sort(key=lambda c: order.index(c.name or c.callback.__name__))
    app.registered_groups.sort(key=lambda group: order.index(group.name))


def main(argv: list[str] | None = None) -> None:
    register(argv)
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
