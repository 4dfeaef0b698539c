"""`orch doctor` as a user runs it (no timeout given) on 16 sandbox nodes, every one of
them on this machine's cores: slow probes are not dead nodes, so every node passes; and a
node frozen among them is still named as not answering, with the connect timeout.

The same at 128 nodes, where the probes queue for the head's cores for minutes, is a
measurement: bench/bench_doctor_scale.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

ORCH = str(Path(sys.executable).with_name("orch"))
REPO = Path(__file__).resolve().parents[2]
NODES = 16


def _doctor(hostfile: str) -> tuple[int, dict]:
    done = subprocess.run(
        [ORCH, "doctor", "--hostfile", hostfile, "--json"], cwd=REPO, capture_output=True,
        text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def _error_nodes(report: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for finding in report["findings"]:
        if finding["severity"] == "error":
            found.setdefault(finding["node"], []).append(finding["problem"])
    return found


def test_defaults_pass_16_nodes_and_still_name_a_frozen_one(sandbox_factory) -> None:
    box, state = sandbox_factory(NODES, 1)
    code, report = _doctor(state.hostfile)
    assert code == 0, _error_nodes(report)
    assert len(report["nodes"]) == NODES

    frozen = state.nodes[-1].name
    box.freeze(frozen)
    try:
        code, report = _doctor(state.hostfile)
    finally:
        box.thaw(frozen)
    assert code == 1
    errors = _error_nodes(report)
    assert list(errors) == [frozen], errors
    assert any("timed out" in problem for problem in errors[frozen]), errors[frozen]
