"""A busy head never tears a healthy job down: several jobs at once, every rank printing as
fast as it can, on a 2-core machine. The head reads their output later than it arrived; what
waits in its own backlog (the nodes' heartbeats among it) is not the nodes' silence."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from launch_support import ORCH, REPO, orch_env

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

FLOOD = str(REPO / "tests" / "jobs" / "flood.py")
JOBS = 3
LINES = 300_000


def test_jobs_flooding_a_busy_head_all_succeed(sandbox_factory, tmp_path: Path) -> None:
    _, state = sandbox_factory(2, 1)
    hosts = [node.name for node in state.nodes]
    started = []
    for job in range(JOBS):
        runs = tmp_path / f"runs{job}"
        # The tightest heartbeat timeout (three beats): the head's backlog under this load
        # lasts longer than it.
        argv = [*ORCH, "launch", "--hostfile", state.hostfile, "--launcher", "torchrun",
                "--no-doctor", "--heartbeat-timeout", "6", "--runs-dir", str(runs),
                FLOOD, str(LINES)]  # fmt: skip
        log = (tmp_path / f"job{job}.out").open("wb")
        started.append((runs, log, subprocess.Popen(argv, cwd=tmp_path, env=orch_env(runs),
                                                    stdout=log, stderr=subprocess.STDOUT)))
    for runs, log, process in started:
        code = process.wait(timeout=900)
        log.close()
        output = Path(log.name).read_text(errors="replace")
        assert code == 0, output[-3000:]
        assert "stopped answering" not in output
        (job,) = [p for p in runs.iterdir() if (p / "job.json").is_file()]
        record = json.loads((job / "job.json").read_text())
        assert record["state"] == "succeeded"
        for rank, node in enumerate(hosts):
            lines = (job / "logs" / f"{node}.log").read_text().splitlines()
            ours = [line for line in lines if f"line {LINES - 1} " in line or "done" in line]
            assert len(ours) == 2 and ours[-1].endswith(f"done {rank}"), (node, ours)
