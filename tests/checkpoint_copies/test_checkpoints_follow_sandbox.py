"""Checkpoints that follow the job, on sandbox nodes that share nothing: each node has its
own checkpoint directory and its own orch directory (bind-mounted in its mount namespace
only, as a local disk), so a node's files die with it. The node holding the only
checkpoint dies mid-job; the restarted job resumes from it on the spare."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from launch_support import ORCH, REPO, free_port, job_ids, log_text, orch_env, run_orch, wait_for

pytestmark = pytest.mark.sandbox

RECIPE = str(REPO / "recipes" / "cpu-resume.yaml")


def _kill_node(box, name: str) -> None:
    """The node dies for good: every process of it, its sshd among them."""
    for pid in box.node_pids(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _record(runs: Path) -> dict:
    """The job's checkpoints.json, or {} while there is none."""
    for job_id in job_ids(runs):
        with contextlib.suppress(OSError, ValueError):
            return json.loads((runs / job_id / "checkpoints.json").read_text())
    return {}


def _every_part_copied(runs: Path) -> str | None:
    """A complete checkpoint every part of which another node holds: its name."""
    for entry in _record(runs).get("checkpoints", []):
        if entry["complete_at"] and entry["parts"] and all(p["holders"] for p in entry["parts"]):
            return entry["name"]
    return None


def _run_and_kill(box, argv: list[str], env: dict[str, str], log: Path, runs: Path,
                  victim: str, then: Callable[[str], object] | None = None,
                  ) -> tuple[int, str, str | None]:  # fmt: skip
    """orch started; once every part of a complete checkpoint is held by another node (and
    `then(its name)` holds, when given), `victim` dies with its disk. (orch's exit code,
    what it printed, that checkpoint)."""
    with log.open("wb") as out:
        orch = subprocess.Popen([*ORCH, *argv], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        copied = wait_for(lambda: _every_part_copied(runs) or orch.poll() is not None, 300, 0.5)
        assert copied and orch.poll() is None, log.read_text()[-4000:]
        saved = _every_part_copied(runs)
        if then is not None:
            ready = wait_for(lambda: then(str(saved)) or orch.poll() is not None, 300, 0.2)
            assert ready and orch.poll() is None, log.read_text()[-4000:]
        _kill_node(box, victim)
        code = orch.wait(timeout=400)
    finally:
        if orch.poll() is None:
            orch.kill()
    return code, log.read_text(), saved


def _nothing_shared(box, names: list[str], tmp_path: Path, runs: Path) -> dict[str, str]:
    """Each node its own checkpoint directory and orch directory, as local disks; orch's
    environment for them."""
    node_root = tmp_path / "orch-node"
    for directory in (tmp_path / "checkpoints", node_root):
        directory.mkdir(mode=0o700)
        for name in names:
            box.private_directory(name, directory)
    return {**orch_env(runs), "ORCH_NODE_ROOT": str(node_root)}


def test_the_node_with_the_only_checkpoint_dies_and_the_spare_resumes_from_it(
    sandbox_factory, tmp_path
):
    box, state = sandbox_factory(4, 1)
    names = [n.name for n in state.nodes]
    checkpoints, runs, log = tmp_path / "checkpoints", tmp_path / "runs", tmp_path / "orch.log"
    env = _nothing_shared(box, names, tmp_path, runs)
    args = ["submit", RECIPE, "--hostfile", state.hostfile, "--no-doctor", "--checkpoint-dir",
            str(checkpoints), "--main-port", str(free_port()), "--hang-timeout", "off", "--",
            "--steps", "450", "--save-every", "150", "--step-sleep", "0.2"]  # fmt: skip
    # Rank 0 (on the first node) writes the only checkpoint in place, every 30 s (twice
    # before the end: a loaded machine copies slowly; saved more often than the 15 s a file
    # must stay unchanged, it would never be copied); once another node holds a whole copy
    # of it, the first node dies with its disk.
    code, said, _saved = _run_and_kill(box, args, env, log, runs, names[0])
    assert code == 0, said[-4000:]
    [job_id] = job_ids(runs)
    entry = f"{job_id}.pt"
    assert f"checkpoints: attempt 2 resumes from {entry}, staged on 3 of 3 nodes" in said, said
    # The second attempt runs on the survivors and the spare; its rank 0 (now on the second
    # node, which never wrote a checkpoint) went on from the saved step, not from 0.
    resumed = [line for line in log_text(runs, job_id, names[1]).splitlines()
               if "attempt 2, from step" in line]  # fmt: skip
    assert resumed and not resumed[0].endswith("from step 0"), log_text(runs, job_id, names[1])
    record = _record(runs)
    [restore] = record["restores"]
    assert (restore["attempt"], restore["entry"]) == (2, entry)
    assert set(restore["nodes"]) == set(names[1:])
    # The spare had nothing: it received the whole checkpoint; the node holding the copy
    # took it from its own copies.
    assert restore["nodes"][names[3]]["received_files"] == 1
    assert restore["nodes"][names[1]]["received_files"] == 0
    shown = run_orch(["checkpoints", job_id], runs)
    assert shown.returncode == 0 and entry in shown.stdout, shown.stdout + shown.stderr
    # After the job, the checkpoint collected onto this machine from the nodes, whole: a
    # file whose sha256 the record keeps, that torch loads.
    gathered = run_orch(["checkpoints", job_id, "--gather", str(tmp_path / "gathered")], runs)
    assert gathered.returncode == 0, gathered.stderr
    assert f"gathered {entry} (1 file, " in gathered.stderr
    got = tmp_path / "gathered" / entry
    recorded = {f["sha256"] for e in _record(runs)["checkpoints"] if e["name"] == entry
                for part in e["parts"] for f in part["files"]}  # fmt: skip
    assert hashlib.sha256(got.read_bytes()).hexdigest() in recorded
    assert torch.load(got, weights_only=True)["step"] > 0


@pytest.mark.slow
def test_accelerate_deepspeed_zero2_resumes_every_shard_after_a_node_dies(sandbox_factory,
                                                                          tmp_path):  # fmt: skip
    """The seeds' path (accelerate + DeepSpeed ZeRO-2 through DeepSpeed's pdsh launcher):
    `accelerator.save_state` writes each rank's optimizer shard on its own node, each file
    of it taking 2 s more (a slow disk). The second node dies with its shard while a newer
    checkpoint is being written; that one is not staged (the survivors' parts of it are set
    aside), and the next attempt (the spare in its place, rank 1 on another node) loads
    every shard of the one before it and goes on from its step."""
    box, state = sandbox_factory(4, 1)
    names = [n.name for n in state.nodes]
    checkpoints, runs, log = tmp_path / "checkpoints", tmp_path / "runs", tmp_path / "orch.log"
    env = _nothing_shared(box, names, tmp_path, runs)
    args = ["submit", str(REPO / "recipes" / "cpu-smoke.yaml"), "--hostfile", state.hostfile,
            "--no-doctor", "--nodes", "3", "--max-restarts", "2", "--checkpoint-dir",
            str(checkpoints), "--hang-timeout", "off", "--",
            "--steps", "150", "--step-sleep", "0.25", "--save-every", "30",
            "--save-pause", "2"]  # fmt: skip
    writing: list[str] = []

    def saving_a_newer_one(saved: str) -> bool:
        """Rank 1 has begun to write a checkpoint newer than `saved`: its name, kept."""
        said = "".join(log_text(runs, job_id, name) for name in names for job_id in job_ids(runs))
        steps = [int(n) for n in re.findall(r"rank 1: saving step (\d+)", said)]
        newer = [n for n in steps if n > int(saved.removeprefix("step_"))]
        writing[:] = [f"step_{max(newer)}"] if newer else []
        return bool(newer)

    code, said, saved = _run_and_kill(box, args, env, log, runs, names[1], saving_a_newer_one)
    assert code == 0, said[-4000:]
    assert len(job_ids(runs)) == 1
    [restore] = _record(runs)["restores"]
    [being_written] = writing
    # The checkpoint being written when the node died is not staged: the one before it is,
    # and the survivors' parts of the other are moved out of the script's sight (it loads
    # the newest step_N/ there); attempt 2 then writes its own under the same name.
    assert restore["entry"] == saved != being_written, (restore, being_written)
    assert restore["set_aside"] == [being_written], restore
    assert (f"newer, not whole, moved to .orch-set-aside/ in the checkpoint directory: "
            f"{being_written}") in said, said[-4000:]  # fmt: skip
    assert f"attempt 2 resumes from {restore['entry']}, staged on 3 of 3 nodes" in said, said
    # Every rank of attempt 2 loaded the state (its own shard among the others) and went on.
    step = restore["entry"].removeprefix("step_")
    for rank in range(3):
        assert f"rank {rank}: resumed from step {step}" in said, said[-4000:]
    assert "final loss" in said
