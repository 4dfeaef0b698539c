"""Quiet work at full length with hang detection as it is by default (no --hang-timeout):
one 2 nodes x 2 ranks torchrun job (gloo) that starts up for 3 minutes without a word,
steps (rank 0 printing every step, so orch learns the pace: a floor of 2 minutes), then
has rank 0 compute for 150 s without a word while the others wait in all_reduce (an
evaluation), steps again, then has every rank write a checkpoint for 150 s without a word.
None of it is a hang: the job ends by itself with 0. The shorter versions of each, with a
lower floor given, are in test_stacks_sandbox.py; the same spells timed against the
collectives' own timeouts are in bench/bench_hang.py."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from dataclasses import dataclass

import pytest
from launch_support import REPO, free_port, job_ids, log_stamp, log_text, start_orch

pytestmark = pytest.mark.sandbox

STEPPING = str(REPO / "tests" / "jobs" / "stepping.py")
STARTUP_S, EVALUATION_S, CHECKPOINT_S = 180, 150, 150
# After the start-up: 10 s of steps (the pace is learned from 20), the evaluation, 10 s of
# steps, the checkpoint, 5 s of steps.
EVALUATION_AT, CHECKPOINT_AT, STEPS_FOR = 10, 170, 325
SCRIPT = (
    "--compute", "0", "--lead-pause", "0.1", "--print-every", "1", "--duty", "0.2",
    "--startup", str(STARTUP_S), "--max-seconds", str(STEPS_FOR),
    f"--quiet=0:{EVALUATION_AT}:{EVALUATION_S}", f"--quiet=-2:{CHECKPOINT_AT}:{CHECKPOINT_S}",
)  # fmt: skip


@dataclass(frozen=True)
class QuietJob:
    code: int
    said: str  # what orch printed
    record: dict
    logs: str  # every node's log
    moments: list[dict]


@pytest.fixture(scope="module")
def quiet_job(sandbox_factory, tmp_path_factory) -> QuietJob:
    _box, state = sandbox_factory(2, 2)
    base = tmp_path_factory.mktemp("quiet")
    runs, out = base / "runs", base / "launch.out"
    args = ["launch", "--hostfile", state.hostfile, "--launcher", "torchrun",
            "--nproc-per-node", "2", "--main-port", str(free_port()), "--no-doctor",
            STEPPING, "--", *SCRIPT]  # fmt: skip
    head = start_orch(args, runs, out)
    try:
        code = head.wait(STARTUP_S + STEPS_FOR + 400)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait(30)
        pytest.fail(f"the job did not end in time:\n{out.read_text()[-4000:]}")
    [job_id] = job_ids(runs)
    record = json.loads((runs / job_id / "job.json").read_text())
    logs = "".join(log_text(runs, job_id, node.name) for node in state.nodes)
    moments = [json.loads(line) for line in
               (runs / job_id / "moments.jsonl").read_text().splitlines()]  # fmt: skip
    return QuietJob(code, out.read_text(), record, logs, moments)


def _first(logs: str, pattern: str) -> float:
    return log_stamp(next(line for line in logs.splitlines() if re.search(pattern, line)))


def test_the_job_with_long_quiet_work_ends_by_itself_and_nothing_was_a_hang(quiet_job):
    assert quiet_job.code == 0, quiet_job.said[-4000:]
    assert quiet_job.record["state"] == "succeeded"
    assert len(quiet_job.record["attempts"]) == 1
    assert "hang" not in [moment["kind"] for moment in quiet_job.moments]
    assert sorted(re.findall(r"rank (\d) done after \d+ steps", quiet_job.logs)) == list("0123")
    assert quiet_job.record["hang_watch"]["source"] != "given"  # learned, as by default


def test_a_start_up_of_3_minutes_before_the_first_step_is_no_hang(quiet_job):
    up = _first(quiet_job.logs, r"rank 0/4 up on ")
    first_step = _first(quiet_job.logs, r"out step 1$")
    assert first_step - up >= STARTUP_S - 1


def test_a_rank_computing_150_s_without_a_word_is_looked_at_and_found_working(quiet_job):
    # Beyond the learned floor of 2 minutes the job was looked at, and the look found the
    # evaluation: rank 0 computing in its own code while the other three waited.
    work = quiet_job.record["hang_watch"]["quiet_work"]
    assert any(re.match(r"rank 0 computing in compute \(", said) for said in work), work
    assert "quiet, working: rank 0 computing in compute (" in quiet_job.said


def test_every_rank_writing_a_checkpoint_150_s_without_a_word_is_no_hang(quiet_job):
    # The checkpoint came after the evaluation and every rank lived through it to the end.
    stamps = [log_stamp(line) for line in quiet_job.logs.splitlines() if " out step " in line]
    gaps = sorted(b - a for a, b in itertools.pairwise(stamps))
    assert gaps[-2] >= min(EVALUATION_S, CHECKPOINT_S) - 5, gaps[-3:]  # both spells, whole
