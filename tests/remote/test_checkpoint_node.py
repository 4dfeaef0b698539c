"""The checkpoint program as a node runs it: its parts shipped in order, one JSON line for
any step, the shipped program run for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _checkpoint_node import JOB, PART, tree
from _shipped import not_loaded_before

from orchestrator.remote import boot_blob, boot_code
from orchestrator.remote.checkpoint_node import CHECKPOINT_PARTS, main


def test_every_part_is_shipped_before_what_imports_it() -> None:
    assert not_loaded_before(CHECKPOINT_PARTS, "checkpoint_node") == []


def test_an_unknown_step_is_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["copy"]) == 2
    said = json.loads(capsys.readouterr().out)
    assert not said["ok"] and "unknown step 'copy'" in said["error"]


@pytest.mark.process
def test_the_shipped_program_scans_and_prunes(tmp_path: Path) -> None:
    top, node_root = tmp_path / "ckpt", tmp_path / "orch"
    tree(top, PART)
    code = boot_code(boot_blob(CHECKPOINT_PARTS, "checkpoint_node"))

    def run(step: str, request: dict[str, Any]) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", code, step], input=json.dumps(request),
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert done.stderr == ""
        return json.loads(done.stdout.splitlines()[-1])

    scanned = run("scan", {"dir": str(top), "job_id": JOB, "node": "n1",
                           "node_root": str(node_root)})  # fmt: skip
    broken = run("scan", {"job_id": JOB})
    pruned = run("prune", {"job_id": JOB, "node_root": str(node_root), "drop": True})

    assert [entry["name"] for entry in scanned["entries"]] == ["global_step10"]
    assert not broken["ok"] and "'dir'" in broken["error"]
    assert pruned == {"ok": True, "removed": []}


@pytest.mark.process
def test_the_shipped_scanner_answers_a_scan_per_line_until_its_stdin_ends(
    tmp_path: Path,
) -> None:
    top, node_root = tmp_path / "ckpt", tmp_path / "orch"
    tree(top, PART)
    code = boot_code(boot_blob(CHECKPOINT_PARTS, "checkpoint_node"))
    pipe = subprocess.PIPE
    scanner = subprocess.Popen([sys.executable, "-c", code, "scans"], stdin=pipe, stdout=pipe,
                               stderr=pipe, text=True)  # fmt: skip
    request = {"dir": str(top), "job_id": JOB, "node": "n1", "node_root": str(node_root)}
    try:
        assert scanner.stdin is not None and scanner.stdout is not None
        answers = []
        for ask in (request, {"job_id": JOB}, request):  # one at a time, as the head asks
            scanner.stdin.write(json.dumps(ask) + "\n")
            scanner.stdin.flush()
            answers.append(json.loads(scanner.stdout.readline()))
        scanner.stdin.close()
        assert scanner.wait(30) == 0
        assert scanner.stderr is not None and scanner.stderr.read() == ""
    finally:
        scanner.kill()
        scanner.wait(10)
    first, broken, again = answers
    assert [entry["name"] for entry in first["entries"]] == ["global_step10"]
    assert not broken["ok"] and "'dir'" in broken["error"]  # a bad request: the scanner goes on
    assert again["entries"] == first["entries"]
