"""Help that teaches: the big commands' options in panels in the order a user reaches for
them, the words an option takes listed and completed by the shell, examples in every
command's help, each paragraph of a command's help on one line for the terminal to wrap."""

from __future__ import annotations

import re

import pytest

from orchestrator.cli.about.reference import commands, root_command
from orchestrator.cli.app import reflowed

LAUNCH_PANELS = ["Nodes", "Script and environment", "Launcher", "Recovery", "Stops and hangs",
                 "Output"]  # fmt: skip


def _help(orch_here, tmp_path, *words: str) -> str:
    result = orch_here([*words, "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _panel_titles(text: str) -> list[str]:
    return [line.split("─ ", 1)[1].split(" ─", 1)[0] for line in text.splitlines()
            if line.startswith("╭─ ")]  # fmt: skip


@pytest.mark.parametrize("command", ["launch", "submit"])
def test_launch_and_submit_show_their_options_in_panels_common_ones_first(orch_here, tmp_path,
                                                                          command):  # fmt: skip
    titles = _panel_titles(_help(orch_here, tmp_path, command))
    assert [t for t in titles if t in LAUNCH_PANELS] == LAUNCH_PANELS
    assert titles[0] == "Arguments"


def test_submits_own_slurm_options_have_their_panel(orch_here, tmp_path):
    assert "Slurm batch job (--sbatch)" in _panel_titles(_help(orch_here, tmp_path, "submit"))


def test_doctor_groups_nodes_checks_and_how_they_are_reached(orch_here, tmp_path):
    titles = _panel_titles(_help(orch_here, tmp_path, "doctor"))
    assert titles == ["Options", "Nodes", "What to check", "Reaching the nodes", "Output"]


@pytest.mark.parametrize(
    ("command", "option", "words"),
    [(["launch"], "--launcher", "<pdsh|standard|torchrun>"),
     (["launch"], "--restart-on", "<infra|any>"),
     (["launch"], "--fanout", "<pdsh|srun>"),
     (["doctor"], "--transport", "<ssh|slurm>"),
     (["config"], "--mixed-precision", "<no|fp16|bf16|fp8>"),
     (["sandbox", "up"], "--sshd", "<default|hardened|no-ssh>")],
)  # fmt: skip
def test_an_option_of_a_fixed_set_lists_its_words(orch_here, tmp_path, command, option, words):
    text = _help(orch_here, tmp_path, *command)
    [line] = [line for line in text.splitlines() if line.startswith("│") and f"{option} " in line]
    assert words in line


def test_every_command_shows_examples_of_itself(orch_here, tmp_path):
    leaves = [name for name, command in commands(root_command())
              if not hasattr(command, "list_commands")]  # fmt: skip
    assert len(leaves) > 15
    for name in leaves:
        text = _help(orch_here, tmp_path, *name.split()[1:])
        examples = text.split("Examples:", 1)[1] if "Examples:" in text else ""
        assert f"{name} " in examples or f"{name}\n" in examples.replace(" \n", "\n"), name


def test_an_alias_of_a_word_is_taken_and_an_unknown_word_refused_with_a_hint(orch_here, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a1 slots=2\n")
    taken = orch_here(["launch", "-H", str(hostfile), "--launcher", "deepspeed", "--dry-run",
                       "--json", "train.py"], tmp_path / "runs")  # fmt: skip
    assert taken.returncode == 0, taken.stderr
    refused = orch_here(["launch", "-H", str(hostfile), "--fanout", "ssh", "train.py"],
                        tmp_path / "runs")  # fmt: skip
    assert refused.returncode == 2
    assert "unknown fan-out 'ssh'" in refused.stderr and "pdsh, srun" in refused.stderr


def _complete(orch_here, monkeypatch, tmp_path, line: str) -> list[str]:
    """What the shell's completion offers after `line` (bash, as typer's script asks)."""
    words = line.split(" ")
    monkeypatch.setenv("_ORCH_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", line)
    monkeypatch.setenv("COMP_CWORD", str(len(words) - 1))
    result = orch_here([], tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_the_shell_completes_commands_and_an_options_words(orch_here, monkeypatch, tmp_path):
    assert _complete(orch_here, monkeypatch, tmp_path, "orch la") == ["launch"]
    offered = _complete(orch_here, monkeypatch, tmp_path, "orch launch --launcher ")
    assert offered == ["pdsh", "standard", "torchrun"]
    assert _complete(orch_here, monkeypatch, tmp_path, "orch launch --restart-on a") == ["any"]


def test_completion_can_be_installed_from_the_root(orch_here, tmp_path):
    text = _help(orch_here, tmp_path)
    assert "--install-completion" in text and "--show-completion" in text


def test_a_help_paragraph_is_one_line_for_the_terminal_to_wrap():
    text = """First line
    goes on.

    Second paragraph,
      indented oddly."""
    assert reflowed(text) == "First line goes on.\n\nSecond paragraph, indented oddly."
    assert reflowed(None) is None


# What typer would show of Python's types, which a user does not type.
_TYPE_WORDS = re.compile(r"<(?:bool|str|int|float|path|list\[\w+\])(?: range)?>|\{\w+\}")


def test_no_help_shows_pythons_types_and_a_flag_shows_no_value(orch_here, tmp_path):
    every = [[], *(name.split()[1:] for name, _ in commands(root_command()))]
    for words in every:
        text = _help(orch_here, tmp_path, *words)
        assert not _TYPE_WORDS.findall(text), (words, _TYPE_WORDS.findall(text))
        [help_line] = [line for line in text.splitlines() if "--help" in line]
        assert help_line.split()[1:3] == ["--help", "Show"]  # no value after the flag


def test_arguments_show_in_capitals_and_the_script_takes_the_rest_of_the_line(orch_here,
                                                                             tmp_path):  # fmt: skip
    assert "Usage: orch launch [OPTIONS] SCRIPT [ARGS]..." in _help(orch_here, tmp_path, "launch")
    assert "Usage: orch status [OPTIONS] [JOB]" in _help(orch_here, tmp_path, "status")
    text = _help(orch_here, tmp_path, "launch")
    [python] = [line for line in text.splitlines() if "│ --python " in line]
    assert "PATH" in python.split()
    missing = orch_here(["logs"], tmp_path)
    assert missing.returncode == 2 and "Missing argument 'JOB'" in missing.stderr


def test_every_command_says_its_exit_codes(orch_here, tmp_path):
    leaves = [name for name, command in commands(root_command())
              if not hasattr(command, "list_commands")]  # fmt: skip
    for name in leaves:
        assert "Exit codes:" in _help(orch_here, tmp_path, *name.split()[1:]), name
