"""The command-line reference, read from the CLI itself: every command with its usage, its
arguments and options as `--help` shows them, as Markdown for the documentation site
(docs/reference/cli.md, written by scripts/cli_reference.py; a test checks it is the CLI's
own)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import typer

from orchestrator.cli.options import EXAMPLES_TITLE

HEADER = """# Command-line reference

Generated from the CLI itself (`python scripts/cli_reference.py`): a test fails when this page
and `orch --help` disagree. What each exit code means: [Exit codes](exit-codes.md). The same
pages for `man`: `docs/man/` (`man -l docs/man/orch-launch.1`; to install them, see
[Install](../index.md#install)).
"""


HEAD_PYTHON = "the head's interpreter (sys.executable)"


def root_command() -> Any:
    """The `orch` command (typer's click group) with every command group registered on it."""
    from orchestrator.cli.main import app, register_all

    register_all()
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


def one_line(text: str | None) -> str:
    """A help text as one line (its paragraphs joined)."""
    return " ".join((text or "").split())


def _panel_of(param: Any) -> str:
    """The `--help` panel the parameter shows in ("" for the unnamed first ones)."""
    return getattr(param, "rich_help_panel", None) or ""


def param_panels(command: Any, name: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each parameter as `--help` shows it (its spellings with their value, its help),
    grouped under its panel as there: the parameters in no panel ("") first."""
    context = _context(command, name)
    panels: dict[str, list[tuple[str, str]]] = {}
    for param in command.params:
        record = param.get_help_record(context)
        if record is not None:
            declared, text = record
            panels.setdefault(_panel_of(param), []).append((declared, one_line(text)))
    return sorted(panels.items(), key=lambda panel: panel[0] != "")


# An option named in prose (`--hostfile`), outside code already: shown as code, which a
# browser does not break at its hyphens.
_OPTION_IN_TEXT = re.compile(r"(?<![\w`-])(--?[a-z][a-z0-9_-]*)(?![\w`])")


def _as_code(text: str) -> str:
    parts = text.split("`")
    parts[::2] = [_OPTION_IN_TEXT.sub(r"`\1`", part) for part in parts[::2]]
    return "`".join(parts)


def _param_lines(command: Any, name: str) -> Iterator[str]:
    for number, (panel, params) in enumerate(param_panels(command, name)):
        if panel:
            yield f"{'' if number == 0 else chr(10)}**{panel}**\n"
        yield from (f"- `{declared}`" + (f": {_as_code(text)}" if text else "")
                    for declared, text in params)  # fmt: skip


def usage(command: Any, name: str) -> str:
    """The usage line: `orch launch [OPTIONS] SCRIPT [ARGS]...`."""
    return f"{name} " + " ".join(command.collect_usage_pieces(_context(command, name)))


def example_lines(command: Any) -> list[str]:
    """The examples of the command's `--help` (its epilog), one a line; none: []."""
    title, _, lines = (command.epilog or "").partition("\n\n")
    if title != EXAMPLES_TITLE:
        return []
    return [line.strip() for line in lines.splitlines()]


def _examples(command: Any) -> str:
    """The examples as a shell block."""
    lines = example_lines(command)
    if not lines:
        return ""
    shown = "\n".join(lines)
    return f"\nExamples:\n\n```bash\n{shown}\n```\n"


def machine_free(text: str) -> str:
    """`text` with the defaults taken from the machine it is made on shown as what they are."""
    return text.replace(sys.executable, HEAD_PYTHON)


def reference_markdown() -> str:
    """The whole reference page."""
    root = root_command()
    parts = [HEADER, "\n## orch\n\n", one_line(root.help) + "\n\n"]
    parts.extend(line + "\n" for line in _param_lines(root, "orch"))
    for name, command in commands(root):
        level = "#" * (1 + name.count(" "))
        parts.append(f"\n#{level} {name}\n\n")
        for paragraph in (command.help or "").split("\n\n"):  # as `--help` shows them
            if paragraph.strip():
                parts.append(_as_code(one_line(paragraph)) + "\n\n")
        parts.append(f"```\n{usage(command, name)}\n```\n\n")
        parts.extend(line + "\n" for line in _param_lines(command, name))
        parts.append(_examples(command))
    # Defaults taken from the machine it runs on are shown as what they are.
    return machine_free("".join(parts).rstrip()) + "\n"
