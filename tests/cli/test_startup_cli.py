"""`orch NAME` imports the module of command NAME alone (cli/main.py): a command that reads
records pays for no SSH library, recipe model or page template, and `orch --help` still
lists every command in its order. Each case runs in a fresh interpreter, as `orch` does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

# What the commands that only read records do not need.
HEAVY = ("paramiko", "pydantic", "jinja2", "orchestrator.run.launch", "orchestrator.ssh")


def _loaded_after(argv: list[str]) -> dict[str, bool]:
    """Which of HEAVY a fresh interpreter holds once `orch ARGV`'s commands are registered."""
    code = (
        "import json, sys\n"
        "from orchestrator.cli.main import register\n"
        f"register({argv!r})\n"
        f"print(json.dumps({{name: name in sys.modules for name in {list(HEAVY)!r}}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.parametrize("argv", [["status"], ["logs", "JOB"], ["stop", "JOB"], ["kill", "JOB"],
                                  ["stacks", "JOB"], ["checkpoints", "JOB"],
                                  ["--debug", "status", "--json"]])  # fmt: skip
def test_a_command_that_reads_records_imports_no_ssh_model_or_template(argv):
    loaded = _loaded_after(argv)
    assert not any(loaded.values()), f"`orch {' '.join(argv)}` imports {loaded}"


def test_launch_imports_what_it_runs_with():
    loaded = _loaded_after(["launch", "train.py"])
    assert loaded["paramiko"] and loaded["orchestrator.run.launch"]


def test_help_and_an_unknown_command_register_every_command_in_order():
    code = (
        "import typer.main\n"
        "from orchestrator.cli.app import app\n"
        "from orchestrator.cli.main import register\n"
        "register(['lanch'])\n"
        "print(' '.join(typer.main.get_command(app).list_commands(None)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    listed = done.stdout.split()
    assert listed[:5] == ["doctor", "hostfile", "config", "launch", "submit"]
    others = {"status", "kill", "logs", "stacks", "stop", "checkpoints", "env", "sandbox"}
    assert others <= set(listed)
