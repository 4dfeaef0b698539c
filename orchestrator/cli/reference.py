"""The command-line reference, read from the CLI itself: every command with its usage, its
arguments and options as `--help` shows them, as Markdown for the documentation site
(docs/reference/cli.md, written by scripts/cli_reference.py; a test checks it is the CLI's
own)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import typer

from orchestrator.cli.options import EXAMPLES_TITLE

HEADER = """# Command-line reference

Generated from the CLI itself (`python scripts/cli_reference.py`): a test fails when this page
and `orch --help` disagree. What each exit code means: [Exit codes](exit-codes.md).
"""


HEAD_PYTHON = "the head's interpreter (sys.executable)"


def root_command() -> Any:
    """The `orch` command (typer's click group) with every command group registered on it."""
    from orchestrator.cli.main import app

    return typer.main.get_command(app)


def _context(command: Any, name: str) -> Any:
    return command.context_class(command, info_name=name)


def commands(group: Any, prefix: str = "orch") -> Iterator[tuple[str, Any]]:
    """Every command under `group`, depth first, by its full name (`orch sandbox up`)."""
    context = _context(group, prefix)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None or command.hidden:
            continue
        full = f"{prefix} {name}"
        yield full, command
        if hasattr(command, "list_commands"):
            yield from commands(command, full)


def option_names(command: Any) -> list[str]:
    """Every option spelling of a command (`--hostfile`, `-H`, `--no-doctor`, ...)."""
    return [name for param in command.params if param.param_type_name == "option"
            and not param.hidden for name in (*param.opts, *param.secondary_opts)]  # fmt: skip


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _panel_of(param: Any) -> str:
    """The `--help` panel the parameter shows in ("" for the unnamed first ones)."""
    return getattr(param, "rich_help_panel", None) or ""


def _param_lines(command: Any, name: str) -> Iterator[str]:
    """Each parameter as `--help` shows it, grouped under its panel as there (the
    parameters in no panel first)."""
    context = _context(command, name)
    panels: dict[str, list[str]] = {}
    for param in command.params:
        record = param.get_help_record(context)
        if record is None:
            continue
        declared, text = record
        line = f"- `{declared}`" + (f": {_one_line(text)}" if text else "")
        panels.setdefault(_panel_of(param), []).append(line)
    for number, (panel, lines) in enumerate(sorted(panels.items(), key=lambda p: p[0] != "")):
        if panel:
            yield f"{'' if number == 0 else chr(10)}**{panel}**\n"
        yield from lines


def _examples(command: Any) -> str:
    """The examples of the command's `--help` (its epilog) as a shell block."""
    title, _, lines = (command.epilog or "").partition("\n\n")
    if title != EXAMPLES_TITLE:
        return ""
    shown = "\n".join(line.strip() for line in lines.splitlines())
    return f"\nExamples:\n\n```bash\n{shown}\n```\n"


def reference_markdown() -> str:
    """The whole reference page."""
    root = root_command()
    parts = [HEADER, "\n## orch\n\n", _one_line(root.help) + "\n\n"]
    parts.extend(line + "\n" for line in _param_lines(root, "orch"))
    for name, command in commands(root):
        level = "#" * (1 + name.count(" "))
        parts.append(f"\n#{level} {name}\n\n")
        if command.help:
            parts.append(_one_line(command.help) + "\n\n")
        usage = " ".join(command.collect_usage_pieces(_context(command, name)))
        parts.append(f"```\n{name} {usage}\n```\n\n")
        parts.extend(line + "\n" for line in _param_lines(command, name))
        parts.append(_examples(command))
    # Defaults taken from the machine it runs on are shown as what they are.
    return "".join(parts).rstrip().replace(sys.executable, HEAD_PYTHON) + "\n"
