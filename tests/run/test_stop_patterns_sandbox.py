"""The save-when-stopped patterns docs/guides/stopping.md shows for accelerate and for
transformers' Trainer, as the recipes' scripts hold them, on a real 2-node sandbox under
torchrun: a Ctrl-C, every rank saves its part of the state and exits by itself, orch exits
130."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from launch_support import REPO, free_port, job_ids, job_json, log_text, start_orch, wait_for

pytestmark = pytest.mark.sandbox
SCRIPTS = REPO / "recipes" / "scripts"


@pytest.fixture(scope="module")
def pair(sandbox_factory):
    return sandbox_factory(2, 1)


def _stopped_by_ctrl_c(pair, script: str, tmp_path: Path) -> tuple[str, Path]:
    """The script launched, Ctrl-C once both ranks are up; orch's output and the out dir."""
    _box, state = pair
    names = [n.name for n in state.nodes]
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    argv = ["launch", "--hostfile", state.hostfile, "--launcher", "torchrun",
            "--main-port", str(free_port()), "--no-doctor", str(SCRIPTS / script), "--",
            "--out", str(out)]  # fmt: skip
    proc = start_orch(argv, runs, tmp_path / "orch.out")
    try:
        assert wait_for(lambda: len(job_ids(runs)) == 1, 60)
        [job_id] = job_ids(runs)
        up = lambda: all(f"rank {r} up" in log_text(runs, job_id, n)  # noqa: E731
                         for r, n in enumerate(names))  # fmt: skip
        assert wait_for(up, 240), (tmp_path / "orch.out").read_text()[-3000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(150) == 130, (tmp_path / "orch.out").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    said = (tmp_path / "orch.out").read_text()
    assert "stopped by Ctrl-C: 2 of 2 ranks exited by themselves within" in said, said[-3000:]
    stop = job_json(runs, job_id)["stop"]
    assert [(r["end"], r["exit_code"]) for r in stop["ranks"]] == [("exited", 0)] * 2
    return said, out


def test_the_accelerate_pattern_saves_every_process_state_when_stopped(pair, tmp_path):
    said, out = _stopped_by_ctrl_c(pair, "accelerate_stop.py", tmp_path)
    [saved] = list(out.iterdir())  # both processes stopped at the same step
    files = {p.name for p in saved.iterdir()}
    assert {"model.safetensors", "random_states_0.pkl", "random_states_1.pkl"} <= files, files
    assert f"rank 0 saved {saved}" in said and f"rank 1 saved {saved}" in said


def test_the_trainer_callback_saves_a_checkpoint_of_every_rank_when_stopped(pair, tmp_path):
    said, out = _stopped_by_ctrl_c(pair, "trainer_stop.py", tmp_path)
    [saved] = [p for p in out.iterdir() if p.name.startswith("checkpoint-")]
    files = {p.name for p in saved.iterdir()}
    assert {"trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"} <= files, files
    step = saved.name.removeprefix("checkpoint-")
    assert f"rank 0 saved at step {step}" in said and f"rank 1 saved at step {step}" in said
