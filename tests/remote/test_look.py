"""The node side of a look (remote/look.py) on this machine's own /proc: with no rank of the
job running yet, the job's other processes (a launcher still starting) are measured."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from orchestrator.outcome.quiet import LauncherSample
from orchestrator.remote import look
from orchestrator.remote.procs import JOB_ID_VAR, NODE_VAR

pytestmark = pytest.mark.process

_BURN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"
_SLEEP = "import time; time.sleep(30)"


def _start(job_id: str, code: str) -> subprocess.Popen:
    env = {**os.environ, JOB_ID_VAR: job_id, NODE_VAR: "n1"}
    return subprocess.Popen([sys.executable, "-c", code], env=env)


@pytest.mark.parametrize(("code", "busy"), [(_BURN, True), (_SLEEP, False)])
def test_a_launcher_starting_with_no_rank_yet_is_measured(code: str, busy: bool) -> None:
    job_id = f"look-{uuid.uuid4().hex[:8]}"
    launcher = _start(job_id, code)
    try:
        doc = look.look(job_id, "n1", sys.executable, 1.0)
    finally:
        launcher.kill()
        launcher.wait()
    assert doc["kind"] == "no-ranks" and "ranks" not in doc
    found = doc["launcher"]
    assert found["processes"] == 1 and found["seconds"] >= 1.0
    # Its CPU as the hang watch judges it (outcome/quiet.py): a burner computes however many
    # other processes share its core (the look counts a twentieth of one), a sleeper does not.
    sample = LauncherSample("n1", found["seconds"], found["cpu"], 0, found["processes"])
    assert sample.working is busy, found


def test_a_node_with_nothing_of_the_job_says_so_at_once() -> None:
    doc = look.look(f"look-{uuid.uuid4().hex[:8]}", "n1", sys.executable, 5.0)
    assert doc["launcher"] == {"processes": 0, "seconds": 0.0, "cpu": None, "io": None}
