"""The documentation's command-line reference is the CLI's own, and every `orch` command line
the README and the documentation show parses as written."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.cli.about.manpages import man_pages
from orchestrator.cli.about.reference import (
    commands,
    option_names,
    reference_markdown,
    root_command,
)

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "cli.md"
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.M | re.S)
# Where a command starts: a line's first word, inside $(...), or after salloc's own options.
_ORCH = re.compile(r"^\s*(?:[A-Z_]+=\$\(|(?:salloc|srun)\s.*?\s)?(orch\s[^)]*)")


def test_the_reference_page_is_the_clis_own() -> None:
    assert PAGE.read_text() == reference_markdown(), (
        "docs/reference/cli.md is out of date: run `python scripts/cli_reference.py`"
    )


def test_every_command_and_option_is_in_the_reference() -> None:
    page = PAGE.read_text()
    missing = [f"{name} {option}" for name, command in commands(root_command())
               for option in ["", *option_names(command)]
               if f"# {name}\n" not in page or option not in page]  # fmt: skip
    assert missing == []


def _orch_lines(text: str) -> list[str]:
    """Every `orch ...` command in the document's shell blocks, continuation lines joined,
    from `orch` on (after `salloc ... `, inside `$(...)`), comments dropped."""
    found = []
    for block in _BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
            match = _ORCH.search(code)
            if match:
                found.append(match.group(1).strip())
    return found


DOC_COMMANDS = sorted({(doc.relative_to(REPO).as_posix(), line) for doc in DOCUMENTS
                       for line in _orch_lines(doc.read_text())})  # fmt: skip


def test_the_documents_show_commands_to_parse() -> None:
    assert len(DOC_COMMANDS) > 40  # the check below is not vacuous


@pytest.mark.parametrize(("document", "line"), DOC_COMMANDS)
def test_every_command_line_in_the_documents_parses(document: str, line: str) -> None:
    words = shlex.split(line)[1:]
    command = root_command()
    path = ["orch"]
    while hasattr(command, "list_commands") and words and not words[0].startswith("-"):
        context = command.context_class(command, info_name=" ".join(path))
        sub = command.get_command(context, words[0])
        assert sub is not None, f"{document}: `{line}`: no command {words[0]!r}"
        command, path, words = sub, [*path, words.pop(0)], words
    if {"--help", "--version", "--install-completion", "--show-completion"} & set(words):
        return  # eager options: they act (print, install) as they are parsed
    try:
        command.make_context(" ".join(path), list(words), resilient_parsing=False)
    except Exception as err:  # click's own errors: the line does not parse
        pytest.fail(f"{document}: `{line}` does not parse: {err}")


MAN_DIR = REPO / "docs" / "man"


def test_the_man_pages_are_the_clis_own():
    pages = man_pages()
    assert sorted(p.name for p in MAN_DIR.glob("*.1")) == sorted(pages), (
        "docs/man/ is out of date: run `python scripts/cli_reference.py`"
    )
    stale = [name for name, text in pages.items() if (MAN_DIR / name).read_text() != text]
    assert stale == [], "docs/man/ is out of date: run `python scripts/cli_reference.py`"


def test_there_is_a_man_page_for_orch_and_every_command():
    names = {p.name for p in MAN_DIR.glob("*.1")}
    assert "orch.1" in names
    assert {name.replace(" ", "-") + ".1" for name, _ in commands(root_command())} <= names


def _rendered(page: Path) -> str:
    """The page as a terminal shows it: man's own rendering, else groff's."""
    environ = {**os.environ, "MANWIDTH": "100", "MAN_KEEP_FORMATTING": "0", "PAGER": "cat"}
    if shutil.which("man"):
        argv = ["man", "-l", str(page)]
    elif shutil.which("groff"):
        argv = ["groff", "-man", "-Tutf8", str(page)]
    else:
        pytest.skip("neither man nor groff to render a man page")
    shown = subprocess.run(argv, capture_output=True, text=True, env=environ, check=True)
    assert "warning" not in shown.stderr, shown.stderr
    return re.sub(".\b", "", shown.stdout)  # overstrikes (bold) read as plain text


@pytest.mark.process
def test_a_man_page_renders_with_its_options_and_examples():
    text = _rendered(MAN_DIR / "orch-launch.1")
    assert "ORCH-LAUNCH(1)" in text
    assert "orch launch [OPTIONS] SCRIPT [ARGS]..." in text
    assert "-w, --nodelist NODESET" in text and "--max-restarts N" in text
    assert "orch launch -H hostfile -N 4 --max-restarts 3 train.py" in text
    assert "\\-" not in text and "\\e" not in text  # roff's escapes read as their characters
