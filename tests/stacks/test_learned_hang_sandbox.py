"""A hang at full length with hang detection as it is by default (no --hang-timeout): a
2 nodes x 2 ranks torchrun job (gloo) whose rank 0 prints every step (orch learns the pace:
a step every 0.1 s, so the floor of 2 minutes holds) until rank 3 stops in plain Python (a
data loader that never yields) while the others wait for it in all_reduce. orch finds no
rank working as the quiet reaches 2 minutes and ends the job then, rank 3 named with its
frame. The same stall with a lower floor given is in test_stacks_sandbox.py; timed against
the collectives' own timeouts, in bench/bench_hang.py."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from launch_support import (
    REPO,
    free_port,
    job_ids,
    job_processes,
    log_stamp,
    log_text,
    start_orch,
)

pytestmark = pytest.mark.sandbox

STEPPING = str(REPO / "tests" / "jobs" / "stepping.py")
FLOOR_S = 120  # the learned threshold's floor: ten times a 0.1 s step is far less
# The look is asked for 6 s before the floor and the hang decided at it; on a loaded
# machine the look itself (ssh, two stack dumps a rank) may take longer than that.
LOOK_OVERRUN_S = 20


def test_a_stalled_rank_is_caught_as_the_quiet_reaches_the_learned_threshold(sandbox_factory,
                                                                            tmp_path):
    _box, state = sandbox_factory(2, 2)
    nodes = [node.name for node in state.nodes]
    runs, out = tmp_path / "runs", tmp_path / "launch.out"
    args = ["launch", "--hostfile", state.hostfile, "--launcher", "torchrun",
            "--nproc-per-node", "2", "--main-port", str(free_port()), "--no-doctor", STEPPING,
            "--", "--compute", "0", "--lead-pause", "0.1", "--print-every", "1",
            "--stall-rank", "3", "--stall-after", "20", "--max-seconds", "600"]  # fmt: skip
    head = start_orch(args, runs, out)
    try:
        code = head.wait(FLOOR_S + 300)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait(30)
        pytest.fail(f"the hang was not caught in time:\n{out.read_text()[-4000:]}")
    said = out.read_text()
    assert code == 124, said[-4000:]
    [job_id] = job_ids(runs)
    logs = "".join(log_text(runs, job_id, node) for node in nodes).splitlines()
    assert any("rank 3 stalls after" in line for line in logs)
    moments = [json.loads(line) for line in
               (runs / job_id / "moments.jsonl").read_text().splitlines()]  # fmt: skip
    [hang] = [moment for moment in moments if moment["kind"] == "hang"]
    # The ranks' last word before the hang (the teardown makes some speak again after it).
    words = [log_stamp(line) for line in logs if re.search(r" r\d/\d (out|err) ", line)]
    last_word = max(stamp for stamp in words if stamp <= hang["t"])
    # Caught as the quiet reached the floor (121 s alone), not minutes later.
    assert FLOOR_S <= hang["t"] - last_word <= FLOOR_S + LOOK_OVERRUN_S, hang["t"] - last_word
    assert (hang["node"], hang["rank"]) == (nodes[1], 3)
    assert re.search(rf"hang: no rank wrote anything for \d+ s \(beyond {FLOOR_S} s: floor\)",
                     said), said[-3000:]  # fmt: skip
    assert "rank 3 on" in said and "next_batch_that_never_comes" in said
    record = json.loads((runs / job_id / "job.json").read_text())
    assert (record["hang_watch"]["seconds"], record["hang_watch"]["source"]) == (FLOOR_S, "floor")
    for node in nodes:
        assert job_processes(node, job_id) == [], f"job left running on {node}"
