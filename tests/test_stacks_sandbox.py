"""`orch stacks` on a real sandbox: 3 nodes x 2 torch ranks (gloo) launched with torchrun.
Every rank's stack, folded; a node that cannot be reached or has no py-spy named beside the
others; the job unharmed; and a profile that names the one slow rank as the straggler."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from launch_support import REPO, free_port, job_ids, log_text, run_orch, start_orch, wait_for

pytestmark = pytest.mark.sandbox

STEPPING = str(REPO / "tests" / "jobs" / "stepping.py")
RANKS = list(range(6))


@pytest.fixture(scope="module")
def cluster(sandbox_factory):
    return sandbox_factory(3, 2)


def _launch_args(hostfile: str, *script_args: str) -> list[str]:
    return [
        "launch", "--hostfile", hostfile, "--launcher", "torchrun", "--nproc-per-node", "2",
        "--main-port", str(free_port()), "--no-doctor", STEPPING, "--", *script_args,
    ]  # fmt: skip


def _ranks_up(runs: Path, job_id: str, nodes: list[str]) -> int:
    return sum(log_text(runs, job_id, node).count(" up on ") for node in nodes)


@pytest.fixture
def running_job(cluster, tmp_path: Path) -> Iterator:
    """Start the stepping job with the given arguments; yield (job id, head process, stop
    file, runs dir); never leave it running."""
    _box, state = cluster
    nodes = [node.name for node in state.nodes]
    runs = tmp_path / "runs"
    stop = tmp_path / "stop"
    started: list[subprocess.Popen[bytes]] = []

    def start(*script_args: str) -> tuple[str, subprocess.Popen[bytes]]:
        args = _launch_args(state.hostfile, "--stop-file", str(stop), "--max-seconds", "240",
                            *script_args)  # fmt: skip
        head = start_orch(args, runs, tmp_path / "launch.out")
        started.append(head)
        assert wait_for(lambda: job_ids(runs), 60), (tmp_path / "launch.out").read_text()
        [job_id] = job_ids(runs)
        up = wait_for(lambda: _ranks_up(runs, job_id, nodes) == len(RANKS), 180)
        assert up, (tmp_path / "launch.out").read_text()
        return job_id, head

    yield start, stop, runs, nodes
    for head in started:
        if head.poll() is None:
            head.send_signal(signal.SIGINT)  # orch tears the job down on every node
            try:
                head.wait(60)
            except subprocess.TimeoutExpired:
                head.kill()
                head.wait(10)


def _stopped_cleanly(head: subprocess.Popen[bytes], stop: Path) -> int:
    stop.touch()
    return head.wait(120)


def _folded_ranks(doc: dict) -> list[int]:
    return sorted(rank for block in doc["stacks"]["blocks"] for rank in block["ranks"])


def _record_copy(runs: Path, job_id: str, elsewhere: Path, **changes: object) -> Path:
    """The job's record with some fields changed, in another runs directory."""
    record = json.loads((runs / job_id / "job.json").read_text())
    record.update(changes)
    (elsewhere / job_id).mkdir(parents=True)
    (elsewhere / job_id / "job.json").write_text(json.dumps(record))
    return elsewhere


def test_stacks_shows_every_rank_folded_and_the_job_ends_normally(running_job, tmp_path):
    start, stop, runs, nodes = running_job
    job_id, head = start("--compute", "0")

    text = run_orch(["stacks", job_id], runs, timeout=120)
    assert text.returncode == 0, text.stderr
    assert f"job {job_id}: 6 rank(s) on 3 node(s)" in text.stdout
    assert "all_reduce" in text.stdout and "stepping.py" in text.stdout

    as_json = run_orch(["stacks", job_id[:15], "--json"], runs, timeout=120)
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["job"] == job_id and doc["mode"] == "dump" and doc["ok"]
    assert [node["node"] for node in doc["nodes"]] == nodes
    assert _folded_ranks(doc) == RANKS
    blocks = doc["stacks"]["blocks"]
    assert len(blocks) < len(RANKS), "identical stacks were not folded"
    biggest = max(blocks, key=lambda block: len(block["ranks"]))
    functions = [f["function"] for t in biggest["threads"] for f in t["frames"]]
    assert "all_reduce" in functions
    saved = Path(doc["saved_as"])
    assert saved.parent == runs / job_id / "stacks"
    assert json.loads(saved.read_text()) == {k: v for k, v in doc.items() if k != "saved_as"}
    assert len(list(saved.parent.glob("*.json"))) == 2  # every call is kept

    # A node that cannot be reached is named; the others still show.
    elsewhere = _record_copy(runs, job_id, tmp_path / "unreachable",
                             hosts=[*nodes, "127.0.0.1:1"])  # fmt: skip
    partial = run_orch(["stacks", job_id, "--json", "--timeout", "10"], elsewhere, timeout=120)
    assert partial.returncode == 1, partial.stderr
    doc = json.loads(partial.stdout)
    assert [node["ok"] for node in doc["nodes"]] == [True, True, True, False]
    assert "127.0.0.1:1" in doc["nodes"][3]["error"] and doc["nodes"][3]["hint"]
    assert _folded_ranks(doc) == RANKS

    # No py-spy beside the interpreter the record names, nor on the nodes' PATH.
    if not shutil.which("py-spy", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"):
        missing = _record_copy(runs, job_id, tmp_path / "no-py-spy",
                               python="/nonexistent/venv/bin/python")  # fmt: skip
        told = run_orch(["stacks", job_id], missing, timeout=120)
        assert told.returncode == 1
        assert "py-spy not found beside /nonexistent/venv/bin/python" in told.stdout
        assert "-m pip install py-spy" in told.stdout
        assert "Traceback" not in told.stdout + told.stderr

    assert _stopped_cleanly(head, stop) == 0
    record = json.loads((runs / job_id / "job.json").read_text())
    assert record["state"] == "succeeded"
    ended = run_orch(["stacks", job_id], runs, timeout=60)
    assert ended.returncode == 1 and "has ended" in ended.stderr


def test_profile_names_the_slow_rank_and_only_it(running_job):
    start, stop, runs, _nodes = running_job
    job_id, head = start("--compute", "0.05", "--slow-rank", "3", "--slow-factor", "5")

    result = run_orch(["stacks", job_id, "--profile", "10"], runs, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "straggler: rank 3 on" in result.stdout
    [saved] = (runs / job_id / "stacks").glob("*.json")
    profile = json.loads(saved.read_text())["profile"]
    straggler = profile["straggler"]
    assert straggler["rank"] == 3
    assert "stepping.py" in straggler["hottest_user_frame"]
    assert "compute" in straggler["hottest_user_frame"]
    others = [rank for rank in profile["ranks"] if rank["rank"] != 3]
    assert len(others) == 5
    for rank in others:  # every other rank waits for it, by more than the margin
        assert rank["comm_share"] - straggler["comm_share"] >= profile["margin"]
    assert _stopped_cleanly(head, stop) == 0
