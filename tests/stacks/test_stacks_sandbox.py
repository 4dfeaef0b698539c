"""`orch stacks` on a real sandbox: 2 nodes x 2 torch ranks (gloo) launched with torchrun.
Every rank's stack, folded; a node that cannot be reached or has no py-spy named beside the
others; the job unharmed; and a profile that names the one slow rank as the straggler."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launch_support import (
    REPO,
    free_port,
    job_ids,
    job_processes,
    log_text,
    run_orch,
    start_orch,
    wait_for,
)

pytestmark = pytest.mark.sandbox

STEPPING = str(REPO / "tests" / "jobs" / "stepping.py")
RANKS = list(range(4))


@pytest.fixture(scope="module")
def cluster(sandbox_factory):
    return sandbox_factory(2, 2)


def _launch_args(hostfile: str, *script_args: str, options: tuple[str, ...] = ()) -> list[str]:
    return [
        "launch", "--hostfile", hostfile, "--launcher", "torchrun", "--nproc-per-node", "2",
        "--main-port", str(free_port()), "--no-doctor", *options, STEPPING, "--", *script_args,
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

    def start(*script_args: str, options: tuple[str, ...] = ()) -> tuple[str, subprocess.Popen]:
        args = _launch_args(state.hostfile, "--stop-file", str(stop), "--max-seconds", "240",
                            *script_args, options=options)  # fmt: skip
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


def _majority_waits_in_all_reduce(doc: dict) -> None:
    blocks = doc["stacks"]["blocks"]
    assert len(blocks) < len(RANKS), "identical stacks were not folded"
    biggest = max(blocks, key=lambda block: len(block["ranks"]))
    functions = [f["function"] for t in biggest["threads"] for f in t["frames"]]
    assert "all_reduce" in functions


def _record_copy(runs: Path, job_id: str, elsewhere: Path, **changes: object) -> Path:
    """The job's record with some fields changed, in another runs directory."""
    record = json.loads((runs / job_id / "job.json").read_text())
    record.update(changes)
    (elsewhere / job_id).mkdir(parents=True)
    (elsewhere / job_id / "job.json").write_text(json.dumps(record))
    return elsewhere


def test_stacks_shows_every_rank_folded_and_the_job_ends_normally(running_job, tmp_path):
    start, stop, runs, nodes = running_job
    job_id, head = start("--compute", "0", "--lead-pause", "0.05")

    text = run_orch(["stacks", job_id], runs, timeout=120)
    assert text.returncode == 0, text.stderr
    assert f"job {job_id}: 4 rank(s) on 2 node(s)" in text.stdout
    assert "all_reduce" in text.stdout and "stepping.py" in text.stdout

    as_json = run_orch(["stacks", job_id[:15], "--json"], runs, timeout=120)
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["job"] == job_id and doc["mode"] == "dump" and doc["ok"]
    assert [node["node"] for node in doc["nodes"]] == nodes
    assert _folded_ranks(doc) == RANKS
    _majority_waits_in_all_reduce(doc)
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
    assert [node["ok"] for node in doc["nodes"]] == [True, True, False]
    assert "127.0.0.1:1" in doc["nodes"][2]["error"] and doc["nodes"][2]["hint"]
    assert _folded_ranks(doc) == RANKS

    # Without ptrace: every rank dumps its own stack on a signal, and runs on.
    signalled = run_orch(["stacks", job_id, "--method", "faulthandler", "--json"], runs,
                         timeout=120)  # fmt: skip
    assert signalled.returncode == 0, signalled.stdout + signalled.stderr
    doc = json.loads(signalled.stdout)
    assert _folded_ranks(doc) == RANKS
    assert {r["method"] for n in doc["nodes"] for r in n["ranks"]} == {"faulthandler"}
    _majority_waits_in_all_reduce(doc)

    # No py-spy beside the interpreter the record names, nor on the nodes' PATH: orch falls
    # back to the ranks' own handler; asked for py-spy alone, it says how to get it.
    if not shutil.which("py-spy", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"):
        missing = _record_copy(runs, job_id, tmp_path / "no-py-spy",
                               python="/nonexistent/venv/bin/python")  # fmt: skip
        fallback = run_orch(["stacks", job_id, "--json"], missing, timeout=120)
        assert fallback.returncode == 0, fallback.stdout + fallback.stderr
        doc = json.loads(fallback.stdout)
        assert _folded_ranks(doc) == RANKS
        assert {r["method"] for n in doc["nodes"] for r in n["ranks"]} == {"faulthandler"}
        told = run_orch(["stacks", job_id, "--method", "py-spy"], missing, timeout=120)
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
    # The one `orch stacks` kept (orch's own, taken as a job runs, say who took them).
    [saved] = [path for path in (runs / job_id / "stacks").glob("*.json")
               if "taken_by" not in json.loads(path.read_text())]  # fmt: skip
    profile = json.loads(saved.read_text())["profile"]  # py-spy's
    straggler = profile["straggler"]
    assert straggler["rank"] == 3
    assert "stepping.py" in straggler["hottest_user_frame"]
    assert "compute" in straggler["hottest_user_frame"]
    others = [rank for rank in profile["ranks"] if rank["rank"] != 3]
    assert len(others) == 3
    for rank in others:  # every other rank waits for it, by more than the margin
        assert rank["comm_share"] - straggler["comm_share"] >= profile["margin"]

    # The same without ptrace: each rank sampled by signal.
    sampled = run_orch(["stacks", job_id, "--profile", "10", "--method", "faulthandler"], runs,
                       timeout=180)  # fmt: skip
    assert sampled.returncode == 0, sampled.stdout + sampled.stderr
    assert "straggler: rank 3 on" in sampled.stdout
    assert _stopped_cleanly(head, stop) == 0


def _nothing_left(nodes: list[str], job_id: str) -> None:
    for node in nodes:
        assert job_processes(node, job_id) == [], f"job left running on {node}"


def test_a_stalled_rank_is_a_hang_named_with_its_function(running_job, tmp_path):
    start, _stop, runs, nodes = running_job
    # Rank 0 prints every step: orch learns the pace (far under the floor given here, 20 s in
    # place of 2 minutes), then rank 3 stalls.
    job_id, head = start("--compute", "0", "--lead-pause", "0.05", "--print-every", "1",
                         "--stall-rank", "3", "--stall-after", "3",
                         options=("--hang-timeout", "auto:20s:60s"))  # fmt: skip
    assert wait_for(lambda: "rank 3 stalls" in "".join(log_text(runs, job_id, n) for n in nodes),
                    60)  # fmt: skip
    stalled_at = time.monotonic()
    code = head.wait(75)
    assert time.monotonic() - stalled_at < 75
    said = (tmp_path / "launch.out").read_text()
    assert code == 124, said
    assert re.search(r"hang: no rank wrote anything for \d+ s \(beyond 20 s: floor\)", said), said
    assert "rank 3 on" in said and "next_batch_that_never_comes" in said
    own = [line for line in said.splitlines() if not line.startswith(tuple(nodes))]
    assert not [line for line in own if "Traceback" in line], said  # orch's own lines
    assert "stood together at" in said and "inside all_reduce" in said

    record = json.loads((runs / job_id / "job.json").read_text())
    assert (record["state"], record["exit_code"]) == ("failed", 124)
    assert (record["hang_watch"]["seconds"], record["hang_watch"]["source"]) == (20, "floor")
    failure = record["first_failure"]
    assert (failure["kind"], failure["rank"], failure["node"]) == ("hang", 3, nodes[1])
    kept = json.loads((runs / job_id / record["teardown_stacks"]).read_text())
    assert _folded_ranks(kept) == RANKS  # every rank's stack is in the record
    assert [o["rank"] for o in kept["stacks"]["stand_apart"]] == [3]
    _nothing_left(nodes, job_id)


def _succeeded_after_quiet_work(runs: Path, job_id: str) -> None:
    """The record: the job succeeded, a quiet was seen and no hang, and the look's finding
    of work raised the threshold."""
    record = json.loads((runs / job_id / "job.json").read_text())
    assert record["state"] == "succeeded"
    assert record["hang_watch"]["source"] == "quiet work seen"  # the look raised it
    lines = (runs / job_id / "moments.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert "quiet" in kinds and "hang" not in kinds


def test_a_rank_computing_without_a_word_beyond_the_hang_timeout_is_not_a_hang(running_job,
                                                                              tmp_path):
    start, _stop, runs, _nodes = running_job
    # Rank 3 computes 30 s before its first step, silently, while the others wait in
    # all_reduce: a job that prints nothing but its ranks' start, a start-up beyond the
    # start-up floor (8 s given here in place of 10 minutes), decided by the look alone. On
    # a fifth of a core: the look counts a twentieth as computing, and the suite shares two.
    job_id, head = start("--compute", "0", "--quiet=3:0:30", "--duty", "0.2",
                         "--max-seconds", "1",
                         options=("--hang-timeout", "auto:8s:8s"))  # fmt: skip
    code = head.wait(150)
    said = (tmp_path / "launch.out").read_text()
    assert code == 0, said
    assert "quiet, working: rank 3 computing in compute (" in said
    # The others wait (how many a look read depends on the load; each that did, in all_reduce).
    assert re.search(r"quiet, working: rank 3 computing in compute \(.*; \d ranks? in all_reduce",
                     said)  # fmt: skip
    _succeeded_after_quiet_work(runs, job_id)


def test_every_rank_writing_a_checkpoint_without_a_word_is_not_a_hang(running_job, tmp_path):
    start, _stop, runs, _nodes = running_job
    # Rank 0 prints every step (orch learns the pace; the floor is 8 s here in place of 2
    # minutes); after 5 s every rank writes a checkpoint for 25 s without a word, a MiB
    # synced every 50 ms (storage I/O: little of the shared disk). The look finds them
    # writing, orch waits on, and the job goes on to its end.
    job_id, head = start("--compute", "0", "--lead-pause", "0.05", "--print-every", "1",
                         "--quiet-rank", "-2", "--quiet-at", "5", "--quiet-for", "25",
                         "--write-pause", "0.05", "--max-seconds", "34",
                         options=("--hang-timeout", "auto:8s:60s"))  # fmt: skip
    code = head.wait(150)
    said = (tmp_path / "launch.out").read_text()
    assert code == 0, said
    writing = r"quiet, working: .*reading or writing storage in save_checkpoint \("
    assert re.search(writing, said), said
    _succeeded_after_quiet_work(runs, job_id)


def _on_node(node: str, script: str) -> str:
    """A Python script run on `node` over plain ssh, with this checkout importable."""
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); {script}"
    result = subprocess.run(["ssh", "-o", "BatchMode=yes", node, f"python3 -c {code!r}"],
                            capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return result.stdout


def test_a_rank_stopped_by_sigstop_is_a_hang_and_named(running_job, tmp_path):
    start, _stop, runs, nodes = running_job
    job_id, head = start("--compute", "0", "--lead-pause", "0.05",
                         options=("--hang-timeout", "auto:8s:8s"))  # fmt: skip
    find = (f"from orchestrator.remote.procs import job_ranks; "
            f"print(dict(job_ranks({job_id!r}, {nodes[1]!r}))[3])")  # fmt: skip
    pid = int(_on_node(nodes[1], find))
    _on_node(nodes[1], f"import os, signal; os.kill({pid}, signal.SIGSTOP)")
    code = head.wait(120)
    said = (tmp_path / "launch.out").read_text()
    assert code == 124, said
    assert "and none is working (" in said and "rank 3 stopped (state T)" in said
    # Nothing printed after the ranks' start: the start-up floor, then the look, decided.
    assert "(beyond 8 s: start-up floor)" in said
    failure = json.loads((runs / job_id / "job.json").read_text())["first_failure"]
    assert (failure["kind"], failure["rank"], failure["node"]) == ("hang", 3, nodes[1])
    _nothing_left(nodes, job_id)


def test_a_crash_keeps_where_the_survivors_stood(running_job, tmp_path):
    start, _stop, runs, nodes = running_job
    # The others are busy in `compute` for 30 s when rank 3 exits 7.
    job_id, head = start("--compute", "30", "--fail-rank", "3", "--fail-after", "0")
    code = head.wait(120)
    said = (tmp_path / "launch.out").read_text()
    assert code == 7, said
    record = json.loads((runs / job_id / "job.json").read_text())
    assert record["first_failure"]["rank"] == 3
    kept = json.loads((runs / job_id / record["teardown_stacks"]).read_text())
    survivors = [0, 1]  # rank 3's node stopped its other rank when it failed
    assert set(survivors) <= set(_folded_ranks(kept)) and 3 not in _folded_ranks(kept)
    functions = {f["function"] for b in kept["stacks"]["blocks"] for t in b["threads"]
                 for f in t["frames"]}  # fmt: skip
    assert "compute" in functions
    assert "every running rank's stack:" in said
    _nothing_left(nodes, job_id)
