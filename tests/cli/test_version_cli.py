"""`orch version`: the versions a bug report needs, read without importing torch, the
programs asked with a time limit; collected on values here, printed as a user sees them."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import pytest

from orchestrator import __version__
from orchestrator.cli.about import version_cmds
from orchestrator.cli.about.versions import (
    NOT_FOUND,
    ProgramAnswer,
    Versions,
    collect_versions,
    run_bounded,
    versions_text,
)

PDSH_SAYS = "pdsh-2.34 (+readline+debug)\nrcmd modules: ssh,rsh,exec (default: rsh)\n"


def _programs(answers: dict[str, ProgramAnswer]):
    asked: list[str] = []

    def run(argv: Sequence[str]) -> ProgramAnswer:
        asked.append(argv[0])
        return answers.get(argv[0], ProgramAnswer(missing=True))

    return run, asked


def _installed(name: str) -> str | None:
    return {"torch": "2.13.0+cpu", "accelerate": "1.15.0"}.get(name)


def test_installed_libraries_are_named_with_their_versions_and_missing_ones_not_found():
    run, _ = _programs({})
    versions = collect_versions(_installed, run)
    libraries = dict(versions.libraries)
    assert libraries["torch"] == "2.13.0+cpu"
    assert libraries["accelerate"] == "1.15.0"
    assert libraries["DeepSpeed"] == NOT_FOUND
    assert versions.orch == __version__


def test_a_program_that_is_not_there_is_not_found_and_one_that_is_says_its_version():
    run, asked = _programs({"pdsh": ProgramAnswer(code=0, output=PDSH_SAYS)})
    programs = dict(collect_versions(_installed, run).programs)
    assert programs == {"pdsh": "pdsh-2.34 (+readline+debug)", "Slurm": NOT_FOUND}
    assert asked == ["pdsh", "sinfo", "srun"]  # srun is asked when sinfo is not there


def test_slurm_is_read_from_srun_when_sinfo_gives_no_version():
    fatal = "sinfo: fatal: Could not establish a configuration source\n"
    run, _ = _programs({"sinfo": ProgramAnswer(code=1, output=fatal),
                        "srun": ProgramAnswer(code=0, output="slurm 22.05.8\n")})  # fmt: skip
    assert dict(collect_versions(_installed, run).programs)["Slurm"] == "slurm 22.05.8"


def test_a_program_that_fails_or_does_not_answer_says_why():
    fatal = "sinfo: fatal: Could not establish a configuration source\n"
    run, _ = _programs({"pdsh": ProgramAnswer(problem="no answer in 5 s"),
                        "sinfo": ProgramAnswer(code=1, output=fatal)})  # fmt: skip
    programs = dict(collect_versions(_installed, run).programs)
    assert programs["pdsh"] == "pdsh: no answer in 5 s"
    assert programs["Slurm"] == (
        "sinfo gave no version: sinfo: fatal: Could not establish a configuration source"
    )


def _fixed() -> Versions:
    return Versions(orch="0.1.0", python="3.11.7", python_path="/venv/bin/python",
                    platform="Linux-6.1-x86_64", libraries=(("torch", "2.13.0+cpu"),
                                                            ("DeepSpeed", NOT_FOUND)),
                    programs=(("pdsh", "pdsh-2.34"), ("Slurm", NOT_FOUND)))  # fmt: skip


def test_the_text_is_one_line_per_version():
    lines = versions_text(_fixed()).splitlines()
    assert lines[0] == "orch 0.1.0"
    assert "- Python: 3.11.7 (/venv/bin/python)" in lines
    assert "- Platform: Linux-6.1-x86_64" in lines
    assert "- DeepSpeed: not found" in lines
    assert lines[-2:] == ["- pdsh: pdsh-2.34", "- Slurm: not found"]


@pytest.mark.parametrize("args", [["version"], ["--version"]])
def test_orch_version_and_dash_dash_version_print_the_report(orch_here, monkeypatch, tmp_path,
                                                             args):  # fmt: skip
    monkeypatch.setattr(version_cmds, "collect_versions", _fixed)
    result = orch_here(args, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("orch 0.1.0\n")
    assert "- torch: 2.13.0+cpu\n" in result.stdout


def test_orch_version_json_is_one_document(orch_here, monkeypatch, tmp_path):
    monkeypatch.setattr(version_cmds, "collect_versions", _fixed)
    result = orch_here(["version", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["orch"] == "0.1.0"
    assert doc["libraries"] == {"torch": "2.13.0+cpu", "DeepSpeed": NOT_FOUND}
    assert doc["programs"] == {"pdsh": "pdsh-2.34", "Slurm": NOT_FOUND}


@pytest.mark.process
def test_a_real_program_is_run_with_a_time_limit_and_a_missing_one_is_missing():
    assert run_bounded(["orch-no-such-program-anywhere"]).missing
    slow = run_bounded([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert slow.problem == "no answer in 0.5 s"
    said = run_bounded([sys.executable, "--version"])
    assert said.code == 0 and said.output.startswith("Python 3.")
