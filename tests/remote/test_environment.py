"""The environment a node's probe reports (remote/environment.py), run as the probe runs it:
`python -c` with its source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.probe.commands import ENVIRONMENT_SOURCE


@pytest.mark.process
def test_a_projects_egg_info_in_the_current_directory_is_not_the_environments(
    tmp_path: Path,
) -> None:
    """A source checkout holds `<project>.egg-info`; `python -c` puts the current directory
    on sys.path, so run from the checkout on the head and from the home directory on a node,
    the same environment would differ by that distribution."""
    info = tmp_path / "demo_project.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: demo-project\nVersion: 9.9\n")
    here = subprocess.run([sys.executable, "-c", ENVIRONMENT_SOURCE], cwd=tmp_path,
                          capture_output=True, timeout=60, check=True)  # fmt: skip
    elsewhere = subprocess.run([sys.executable, "-c", ENVIRONMENT_SOURCE], cwd="/",
                               capture_output=True, timeout=60, check=True)  # fmt: skip
    seen_here, seen_elsewhere = json.loads(here.stdout), json.loads(elsewhere.stdout)
    assert "demo-project" not in seen_here["dists"]
    assert seen_here["fingerprint"] == seen_elsewhere["fingerprint"]
