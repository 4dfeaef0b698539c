"""Man pages, read from the CLI itself as the reference page is (cli/about/reference.py): `orch(1)`
and one page per command (`orch-launch(1)`, `orch-sandbox-up(1)`), in roff, written to
docs/man/ by scripts/cli_reference.py (a test checks they are the CLI's own)."""

from __future__ import annotations

from typing import Any

from orchestrator import __version__
from orchestrator.cli.about.reference import (
    commands,
    example_lines,
    machine_free,
    one_line,
    param_panels,
    root_command,
    usage,
)

_MANUAL = "orch manual"
_SEE_DOCS = (
    "The documentation site (docs/ in orch's sources): guides, the recipe keys, the exit codes."
)


def page_name(command_name: str) -> str:
    """`orch sandbox up` -> `orch-sandbox-up`."""
    return command_name.replace(" ", "-")


def _escaped(text: str) -> str:
    """Text roff prints as it is: a backslash, and a line starting with `.` or `'`, would be
    read as roff's own; `-` is a hyphen that may break a line, `\\-` the minus of options."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line
                     for line in text.split("\n"))  # fmt: skip


def _paragraphs(help_text: str | None) -> list[str]:
    paragraphs = (help_text or "").split("\n\n")
    return [".PP\n" + _escaped(one_line(p)) for p in paragraphs if p.strip()]


def _options(command: Any, name: str) -> list[str]:
    lines = []
    for panel, params in param_panels(command, name):
        if panel:
            lines.append(".SS " + _escaped(panel))
        for declared, text in params:
            lines += [".TP", ".B " + _escaped(declared), _escaped(text or "")]
    return [".SH OPTIONS", *lines] if lines else []


def _examples(command: Any) -> list[str]:
    shown = example_lines(command)
    if not shown:
        return []
    return [".SH EXAMPLES", ".nf", ".RS 4", *(_escaped(line) for line in shown), ".RE", ".fi"]


def _header(name: str, summary: str) -> list[str]:
    title = page_name(name).upper()
    return [
        f'.TH "{title}" "1" "" "orch {__version__}" "{_MANUAL}"',
        ".SH NAME",
        f"{_escaped(page_name(name))} \\- {_escaped(summary)}",
    ]


def _summary(command: Any) -> str:
    return one_line((command.help or "").split("\n\n")[0])


def _command_page(name: str, command: Any, subcommands: list[str]) -> str:
    lines = [*_header(name, _summary(command)), ".SH SYNOPSIS", _escaped(usage(command, name)),
             ".SH DESCRIPTION", *_paragraphs(command.help), *_options(command, name),
             *_examples(command)]  # fmt: skip
    see = ["orch(1)", *(f"{page_name(sub)}(1)" for sub in subcommands)]
    lines += [".SH SEE ALSO", _escaped(", ".join(see)), ".PP", _escaped(_SEE_DOCS)]
    return machine_free("\n".join(lines)) + "\n"


def _root_page(root: Any, listed: list[tuple[str, Any]]) -> str:
    lines = [*_header("orch", one_line(root.help)), ".SH SYNOPSIS",
             _escaped(usage(root, "orch")), ".SH DESCRIPTION", *_paragraphs(root.help),
             *_options(root, "orch"), ".SH COMMANDS"]  # fmt: skip
    for name, command in listed:
        lines += [".TP", f".BR {page_name(name)} (1)", _escaped(_summary(command))]
    lines += [".SH SEE ALSO", ".PP", _escaped(_SEE_DOCS)]
    return machine_free("\n".join(lines)) + "\n"


def man_pages() -> dict[str, str]:
    """Every page by its file name (`orch.1`, `orch-launch.1`, ...)."""
    root = root_command()
    listed = list(commands(root))
    pages = {"orch.1": _root_page(root, listed)}
    for name, command in listed:
        subcommands = [sub for sub, _ in listed if sub.startswith(name + " ")]
        pages[page_name(name) + ".1"] = _command_page(name, command, subcommands)
    return pages
