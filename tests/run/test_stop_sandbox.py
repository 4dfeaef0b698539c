"""A stop gives the job time to save, on a real sandbox: the first Ctrl-C on the head, `orch
stop` from another terminal and --time-limit send every rank the stop signal and wait; ranks
that take 40 s to save (longer than torchrun's and DeepSpeed's own 30 s between their TERM
and their KILL) save and exit by themselves on every launcher; their DataLoader-like
children get no signal; nothing is left on any node. A second Ctrl-C ends the job at once,
and the grace's end kills what is left."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from launch_support import (
    REPO,
    free_port,
    job_ids,
    job_json,
    job_processes,
    log_text,
    run_orch,
    start_orch,
    wait_for,
)

pytestmark = pytest.mark.sandbox
SAVING = str(REPO / "tests" / "jobs" / "saving.py")
SAVE_S = 40.0  # longer than every launcher's own TERM-to-KILL (30 s)


@pytest.fixture(scope="module")
def pair(sandbox_factory):
    """Two nodes with two ranks each."""
    return sandbox_factory(2, 2)


def _launch(hostfile: str, launcher: str, out: Path, *options: str, save: float = SAVE_S,
            script: tuple[str, ...] = ()) -> list[str]:  # fmt: skip
    return ["launch", "--hostfile", hostfile, "--launcher", launcher, "--nproc-per-node", "2",
            "--main-port", str(free_port()), "--no-doctor", *options, SAVING, "--",
            "--out", str(out), "--save-seconds", f"{save:g}", *script]  # fmt: skip


def _start(pair, launcher: str, tmp_path: Path, *options: str, **more) -> tuple:
    _box, state = pair
    names = [n.name for n in state.nodes]
    out = tmp_path / "out"
    out.mkdir()
    runs = tmp_path / "runs"
    proc = start_orch(_launch(state.hostfile, launcher, out, *options, **more), runs,
                      tmp_path / "orch.out")  # fmt: skip
    assert wait_for(lambda: len(job_ids(runs)) == 1, 60)
    [job_id] = job_ids(runs)
    up = lambda: all(log_text(runs, job_id, n).count(" up, grace ") == 2 for n in names)  # noqa: E731
    if not wait_for(up, 180):
        proc.kill()
        pytest.fail((tmp_path / "orch.out").read_text()[-3000:])
    return proc, names, runs, job_id, out


def _saved(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.endswith(".saved"))


def _nothing_left(names: list[str], job_id: str) -> None:
    for node in names:
        assert wait_for(lambda node=node: job_processes(node, job_id) == [], 30), node


def _ctrl_c_saves_every_rank(pair, launcher: str, tmp_path: Path) -> None:
    proc, names, runs, job_id, out = _start(pair, launcher, tmp_path)
    try:
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(SAVE_S + 90) == 130
        took = time.monotonic() - asked
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "orch.out").read_text()
    assert took >= SAVE_S, text[-3000:]
    assert _saved(out) == [f"rank{r}.saved" for r in range(4)], text[-3000:]
    assert [p.name for p in out.iterdir() if p.name.startswith("worker")] == []
    assert "stopped by Ctrl-C: 4 of 4 ranks exited by themselves within" in text
    _nothing_left(names, job_id)
    record = job_json(runs, job_id)
    assert (record["state"], record["exit_code"]) == ("interrupted", 130)
    stop = record["stop"]
    assert (stop["cause"], stop["signal"], stop["grace"], stop["ending"]) == (
        "ctrl-c", "SIGTERM", 120.0, "ranks-exited")
    assert [(r["rank"], r["end"], r["exit_code"]) for r in stop["ranks"]] == [
        (r, "exited", 0) for r in range(4)]
    assert all(stop["asked_at"] <= r["signalled_at"] <= r["ended_at"] for r in stop["ranks"])
    for rank in range(4):  # the ranks see the stop's grace
        assert f"rank {rank}/4 up, grace 120 s" in log_text(runs, job_id, names[rank // 2])


def test_ctrl_c_on_torchrun_lets_every_rank_save_for_longer_than_torchruns_own_limit(
    pair, tmp_path
):
    _ctrl_c_saves_every_rank(pair, "torchrun", tmp_path)


@pytest.mark.slow
def test_ctrl_c_on_the_pdsh_launcher_lets_every_rank_save_for_longer_than_deepspeeds_limit(
    pair, tmp_path
):
    _ctrl_c_saves_every_rank(pair, "pdsh", tmp_path)


@pytest.mark.slow
def test_orch_stop_from_another_terminal_stops_a_standard_launcher_job_that_saves(
    pair, tmp_path
):
    proc, names, runs, job_id, out = _start(pair, "standard", tmp_path)
    try:
        stopped = run_orch(["stop", job_id], runs, timeout=SAVE_S + 150)
        assert stopped.returncode == 0, stopped.stderr
        assert proc.wait(30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopped by `orch stop`: 4 of 4 ranks exited by themselves" in stopped.stderr
    assert f"job {job_id}: stopped" in stopped.stderr
    assert _saved(out) == [f"rank{r}.saved" for r in range(4)]
    assert [p.name for p in out.iterdir() if p.name.startswith("worker")] == []
    _nothing_left(names, job_id)
    record = job_json(runs, job_id)
    assert (record["state"], record["exit_code"], record["stop"]["cause"]) == (
        "stopped", 143, "orch-stop")


def test_a_second_ctrl_c_during_the_grace_ends_the_job_at_once(pair, tmp_path):
    proc, names, runs, job_id, out = _start(pair, "torchrun", tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        saving = lambda: all("saving at step" in log_text(runs, job_id, n) for n in names)  # noqa: E731
        assert wait_for(saving, 60)
        again = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        assert time.monotonic() - again < 30  # the teardown's own seconds, not the save's
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _saved(out) == []
    _nothing_left(names, job_id)
    record = job_json(runs, job_id)
    assert (record["state"], record["stop"]["ending"]) == ("interrupted", "cut-short")
    assert {r["end"] for r in record["stop"]["ranks"]} == {"killed"}


def test_the_time_limit_stops_the_job_and_the_graces_end_kills_a_rank_still_saving(
    pair, tmp_path
):
    proc, names, runs, job_id, out = _start(
        pair, "torchrun", tmp_path, "--time-limit", "40s", "--stop-grace", "15", save=3,
        script=("--slow-rank", "3", "--slow-save-seconds", "300"),
    )  # fmt: skip
    try:
        assert proc.wait(150) == 124
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "orch.out").read_text()
    assert _saved(out) == ["rank0.saved", "rank1.saved", "rank2.saved"], text[-3000:]
    assert "stopped by the time limit: 3 of 4 ranks exited by themselves" in text
    assert f"killed at the end of the 15 s grace: rank 3 on {names[1]}" in text
    _nothing_left(names, job_id)
    record = job_json(runs, job_id)
    assert (record["state"], record["exit_code"]) == ("stopped", 124)
    stop = record["stop"]
    assert (stop["cause"], stop["ending"], stop["grace"]) == ("time-limit", "grace-over", 15.0)
    assert [r["end"] for r in stop["ranks"]] == ["exited", "exited", "exited", "killed"]
    assert json.loads(json.dumps(stop))["torn_down_at"] >= stop["asked_at"] + 15


@pytest.mark.slow
def test_the_resume_recipe_saves_when_stopped_and_a_new_job_goes_on_from_there(pair, tmp_path):
    _box, state = pair
    names = [n.name for n in state.nodes]
    checkpoints = tmp_path / "checkpoints"
    base = ["submit", str(REPO / "recipes" / "cpu-resume.yaml"), "--hostfile", state.hostfile,
            "--nodes", "2", "--no-doctor"]  # fmt: skip
    first_runs = tmp_path / "first"
    stopped = run_orch([*base, "--main-port", str(free_port()), "--time-limit", "30s", "--",
                        "--steps", "100000", "--checkpoint-dir", str(checkpoints)],
                       first_runs, timeout=300)  # fmt: skip
    assert stopped.returncode == 124, stopped.stderr[-3000:]
    assert "stopped by the time limit: 2 of 2 ranks exited by themselves" in stopped.stderr
    [first] = job_ids(first_runs)
    said = [line for line in log_text(first_runs, first, names[0]).splitlines()
            if "stopped at step" in line]  # fmt: skip
    assert len(said) == 1, log_text(first_runs, first, names[0])[-2000:]
    step = int(said[0].split("stopped at step ")[1].split(":")[0])
    saved = checkpoints / f"{first}.pt"
    assert saved.exists()
    second_runs = tmp_path / "second"
    resumed = run_orch([*base, "--main-port", str(free_port()), "--", "--steps", str(step + 3),
                        "--checkpoint-dir", str(checkpoints), "--resume-from", str(saved)],
                       second_runs, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    [second] = job_ids(second_runs)
    log = log_text(second_runs, second, names[0])
    assert f"attempt 1, from step {step}" in log
    assert f"done at step {step + 3}" in log
