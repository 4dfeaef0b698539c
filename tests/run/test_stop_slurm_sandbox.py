"""A stop inside a Slurm allocation whose nodes srun starts and orch reaches through Slurm
alone (--transport slurm): the first Ctrl-C's stop signal goes to every rank through srun
steps beside the job's, and ranks that save for longer than torchrun's own 30 s limit save
and exit by themselves."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from launch_support import (
    ORCH,
    REPO,
    job_ids,
    job_json,
    job_processes,
    log_text,
    slurm_env,
    wait_for,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]
SAVING = str(REPO / "tests" / "jobs" / "saving.py")


def test_ctrl_c_under_srun_lets_every_rank_save(sandbox_factory, tmp_path):
    _box, state = sandbox_factory(2, 2, slurm=True)
    names = [n.name for n in state.nodes]
    out = tmp_path / "out"
    out.mkdir()
    runs = tmp_path / "runs"
    argv = ["salloc", "-N2", "--ntasks-per-node=2", *ORCH, "launch", "--slurm", "--transport",
            "slurm", "--launcher", "torchrun", "--no-doctor", SAVING, "--", "--out", str(out),
            "--save-seconds", "35"]  # fmt: skip
    with (tmp_path / "salloc.log").open("wb") as log:
        salloc = subprocess.Popen(argv, cwd=REPO, env=slurm_env(state, runs), stdout=log,
                                  stderr=subprocess.STDOUT)  # fmt: skip
    try:
        assert wait_for(lambda: len(job_ids(runs)) == 1, 60)
        [job_id] = job_ids(runs)
        up = lambda: all(log_text(runs, job_id, n).count(" up, grace ") == 2 for n in names)  # noqa: E731
        assert wait_for(up, 180), (tmp_path / "salloc.log").read_text()[-3000:]
        head = job_json(runs, job_id)["head_pid"]
        os.kill(head, signal.SIGINT)  # Ctrl-C on orch alone
        assert salloc.wait(150) == 130, (tmp_path / "salloc.log").read_text()[-3000:]
    finally:
        if salloc.poll() is None:
            salloc.kill()
    text = (tmp_path / "salloc.log").read_text()
    assert sorted(p.name for p in out.iterdir()) == [f"rank{r}.saved" for r in range(4)], text
    assert "stopped by Ctrl-C: 4 of 4 ranks exited by themselves" in text
    for node in names:
        assert wait_for(lambda node=node: job_processes(node, job_id) == [], 30), node
    record = job_json(runs, job_id)
    assert record["transport"] == "slurm" and record["stop"]["ending"] == "ranks-exited"


def test_an_allocations_time_limit_stops_the_job_in_time_for_every_rank_to_save(
    sandbox_factory, tmp_path
):
    _box, state = sandbox_factory(2, 2, slurm=True)
    names = [n.name for n in state.nodes]
    out = tmp_path / "out"
    out.mkdir()
    runs = tmp_path / "runs"
    # Three minutes of allocation, a 50 s grace: orch stops the job 110 s before the end,
    # and the ranks save for 40 s, longer than torchrun's own 30 s.
    argv = ["salloc", "-N2", "--ntasks-per-node=2", "--time=3", *ORCH, "launch", "--slurm",
            "--launcher", "torchrun", "--no-doctor", "--stop-grace", "50", SAVING, "--",
            "--out", str(out), "--save-seconds", "40"]  # fmt: skip
    log_path = tmp_path / "salloc.log"
    with log_path.open("wb") as log:
        salloc = subprocess.Popen(argv, cwd=REPO, env=slurm_env(state, runs), stdout=log,
                                  stderr=subprocess.STDOUT)  # fmt: skip
    try:
        assert salloc.wait(230) == 124, log_path.read_text()[-3000:]
    finally:
        if salloc.poll() is None:
            salloc.kill()
    text = log_path.read_text()
    assert "the Slurm allocation ends in " in text
    assert "their grace of 50 s ending before it" in text
    assert sorted(p.name for p in out.iterdir()) == [f"rank{r}.saved" for r in range(4)], text
    assert "stopped by the Slurm allocation's time limit: 4 of 4 ranks exited by themselves" in text
    [job_id] = job_ids(runs)
    record = job_json(runs, job_id)
    assert record["stop"]["cause"] == "slurm-time-limit" and record["state"] == "stopped"
    for node in names:
        assert wait_for(lambda node=node: job_processes(node, job_id) == [], 30), node
