"""The head's side of environment parity: what the script imports, by distribution."""

from __future__ import annotations

from pathlib import Path

from orchestrator.prepare.preflight import script_packages


def test_the_scripts_imports_are_named_by_their_distributions(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import os, torch\nfrom accelerate import Accelerator\nimport yaml\n")
    assert script_packages(str(script)) == {"torch", "accelerate", "pyyaml"}
    assert script_packages(str(tmp_path / "missing.py")) == frozenset()
