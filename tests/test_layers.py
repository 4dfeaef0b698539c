"""The layers hold: read from the code's imports (tests/_layers.py), on orch itself and on
small fixture trees that each break one rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from _layers import violations

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"


def test_orch_keeps_every_layer_rule():
    found = violations(PACKAGE)
    assert found == [], "\n".join(found)


MODULE_LINES = 450
FOLDER_LINES = 3000  # a folder's own modules, its subfolders apart
FLAT_FOLDERS = ("remote",)  # the node programs, shipped flat beside each other


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_grows_past_one_job():
    too_long = [f"{p.relative_to(PACKAGE.parent)}: {_lines(p)} lines"
                for p in sorted(PACKAGE.rglob("*.py")) if _lines(p) > MODULE_LINES]  # fmt: skip
    assert too_long == [], f"split by responsibility (over {MODULE_LINES} lines): {too_long}"


def test_no_folder_grows_past_a_layer_one_reads_whole():
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    too_big = {
        str(folder.relative_to(PACKAGE.parent)): lines
        for folder in sorted(folders)
        if folder.name not in FLAT_FOLDERS
        and (lines := sum(_lines(p) for p in folder.glob("*.py"))) > FOLDER_LINES
    }
    assert too_big == {}, f"split into subfolders (over {FOLDER_LINES} lines): {too_big}"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "orchestrator"
    for name in ("", "specs", "remote", "ssh", "checks", "plan", "outcome", "run", "report", "cli"):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "__init__.py").write_text("")
    for name, text in files.items():
        (root / name).write_text(text)
    return root


CLEAN = {
    "errors.py": "class OrchError(Exception):\n    pass\n",
    "specs/constants.py": "PORT = 29500\n",
    "remote/agent.py": (
        "import os\n\ndef load():\n    import torch\n    from orchestrator.remote import logwire\n"
    ),
    "remote/logwire.py": "import json\n",
    # A node loads remote/logwire.py beside the program as orch_logwire.
    "remote/channel.py": (
        "try:\n    import orch_logwire as logwire\nexcept ImportError:\n"
        "    from orchestrator.remote import logwire\n"
    ),
    "ssh/connect.py": (
        "import socket\n\nimport paramiko\n\nfrom orchestrator.errors import OrchError\n"
    ),
    "checks/node.py": "from orchestrator.specs.constants import PORT\n",
    "plan/launch_plan.py": "from orchestrator.remote import agent\nfrom . import pdsh_argv\n",
    "plan/pdsh_argv.py": "import shlex\n",
    "run/launch.py": "import subprocess\n\nfrom orchestrator.plan import launch_plan\n",
    "outcome/verdict.py": "import signal\n",
    "cli/app.py": "import typer\n",
    "cli/main.py": "from orchestrator.cli import app, job_cmds\n",
    "cli/job_cmds.py": (
        "from orchestrator.cli.app import app\nfrom orchestrator.run import launch\n"
    ),
}


def test_a_tree_that_keeps_the_rules_passes(tmp_path):
    assert violations(_tree(tmp_path, CLEAN)) == []


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        (
            {"specs/constants.py": "from orchestrator.specs import jobenv\n",
             "specs/jobenv.py": "from orchestrator.specs.constants import PORT\n"},
            "import cycle: specs/constants -> specs/jobenv -> specs/constants",
        ),
        (
            {"plan/pdsh_argv.py": "def later():\n    from orchestrator.plan import launch_plan\n"},
            "import cycle: plan/launch_plan -> plan/pdsh_argv -> plan/launch_plan",
        ),
        (
            {"remote/logwire.py": "import yaml\n"},
            "orchestrator/remote/logwire.py:1 imports yaml "
            "(remote/ imports only the standard library at module level)",
        ),
        (
            {"remote/logwire.py": "def f():\n    import requests\n"},
            "orchestrator/remote/logwire.py:2 imports requests "
            "(remote/ imports only the standard library)",
        ),
        (
            {"remote/channel.py": "import orch_nothing\n"},
            "orchestrator/remote/channel.py:1 imports orch_nothing "
            "(remote/ imports only the standard library at module level)",
        ),
        (
            {"remote/logwire.py": "from orchestrator.errors import OrchError\n"},
            "orchestrator/remote/logwire.py:1 imports orchestrator.errors "
            "(remote/ imports nothing of orch outside remote/)",
        ),
        (
            {"run/launch.py": "import paramiko\n"},
            "orchestrator/run/launch.py:1 imports paramiko (paramiko only under ssh/)",
        ),
        (
            {"run/launch.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                              "    from paramiko import SFTPClient\n"},
            "orchestrator/run/launch.py:4 imports paramiko (paramiko only under ssh/)",
        ),
        (
            {"checks/node.py": "import subprocess\n"},
            "orchestrator/checks/node.py:1 imports subprocess (checks/ is pure)",
        ),
        (
            {"outcome/verdict.py": "import socket\n"},
            "orchestrator/outcome/verdict.py:1 imports socket (outcome/ is pure)",
        ),
        (
            {"checks/node.py": "def f():\n    from orchestrator.plan import launch_plan\n"},
            "orchestrator/checks/node.py:2 imports orchestrator.plan.launch_plan "
            "(checks comes before plan in the data flow)",
        ),
        (
            {"report/page.py": "import subprocess\n"},
            "orchestrator/report/page.py:1 imports subprocess (report/ is pure)",
        ),
        (
            {"report/page.py": "def f():\n    from orchestrator.run import launch\n"},
            "orchestrator/report/page.py:2 imports orchestrator.run.launch "
            "(report comes before run in the data flow)",
        ),
        (
            {"remote/agent.py": "import socket\n"},
            "orchestrator/plan/launch_plan.py:1 imports orchestrator.remote.agent "
            "(plan/ is pure; that reaches remote/agent -> socket)",
        ),
        (
            {"outcome/verdict.py": "from orchestrator.run import launch\n",
             "report/page.py": "from orchestrator.outcome.verdict import JobState\n"},
            "orchestrator/outcome/verdict.py:1 imports orchestrator.run.launch "
            "(outcome comes before run in the data flow)",
        ),
        (
            {"report/page.py": "from orchestrator.run import launch\n"},
            "orchestrator/report/page.py:1 imports orchestrator.run.launch "
            "(report/ is pure; that reaches run/launch -> subprocess)",
        ),
        (
            {"cli/app.py": "from orchestrator.cli import job_cmds\n"},
            "orchestrator/cli/app.py:1 imports orchestrator.cli.job_cmds "
            "(cli/app.py imports no command module)",
        ),
    ],
)  # fmt: skip
def test_each_broken_rule_is_named_with_its_file_line_and_import(tmp_path, broken, expected):
    found = violations(_tree(tmp_path, {**CLEAN, **broken}))
    assert expected in found, found
