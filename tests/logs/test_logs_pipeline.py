"""The whole log path on a real sandbox: node-side framing, real pdsh, head-side logs, pull-back.

Each node runs tests/_lognode.py (a rank printing 100,000 numbered lines to each
of stdout and stderr, tqdm bars, \\r frames, a 1 MiB line, invalid UTF-8, no
final newline) through `pdsh -R ssh`; pdsh's output goes through LogRouter, the
raw files come back with collect_logs, and the head-side log of each stream must
be exactly what a terminal user would keep of the raw bytes the node wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from _logmodel import expected_log, rank_tag, read_log
from launch_support import wait_for

from orchestrator.logs.router import LogRouter
from orchestrator.records.rundir import RunDir
from orchestrator.remote.agent import node_dir
from orchestrator.remote.agent_spec import runs_root
from orchestrator.run.collect import collect_logs

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
NODE_PROGRAM = Path(__file__).resolve().parents[1] / "_lognode.py"
LINES = 100_000


@pytest.fixture(scope="module")
def sandbox(sandbox_factory):
    """Two nodes of one slot (conftest's has 4): every line of two nodes interleaving in one
    fan-out is the path's test; each node more only repeats it, at the CPU's cost."""
    return sandbox_factory(2, 1)


def start_pdsh(nodes: list[str], raw_dir: Path, lines: int, pause: float = 0.0):
    command = " ".join(
        [sys.executable, str(NODE_PROGRAM), str(REPO), str(raw_dir), "%h", str(lines), str(pause)]
    )
    return subprocess.Popen(
        ["pdsh", "-R", "ssh", "-f", "32", "-w", ",".join(nodes), command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def pump(
    process: subprocess.Popen,
    router: LogRouter,
    stop_after_lines: int | None = None,
    nodes: Sequence[str] = (),
):
    """Feed pdsh's output to the router; stop early once every one of `nodes` (or, with
    none named, all of them together) has sent `stop_after_lines` lines."""
    controls = []
    prefixes = [f"{node}: ".encode() for node in nodes]
    seen = [0] * len(prefixes)
    fd = process.stdout.fileno()
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            break
        controls += router.feed(data)
        for i, prefix in enumerate(prefixes):
            seen[i] += data.count(b"\n" + prefix)
        if stop_after_lines is None:
            continue
        counts = seen if prefixes else [router.lines]
        if min(counts) >= stop_after_lines:
            break
    return controls


@pytest.fixture
def job_dirs(tmp_path: Path):
    job = f"logpipe-{uuid.uuid4().hex[:8]}"
    raw_dir = Path(runs_root(os.getuid())) / job  # where the agent keeps raw logs on each node
    yield job, raw_dir, tmp_path / "run"
    shutil.rmtree(raw_dir, ignore_errors=True)


def check_stream(entries, tag: bytes, raw: bytes, *, complete: bool = True) -> list[bytes]:
    got = [text for t, text in entries if t == tag]
    want = expected_log(raw)
    if complete:
        assert got == want
    else:
        # Cut off mid-way: everything before the cut is there, in order. The last
        # entry may be a line the kill split (it is written as far as it came), or the
        # progress frame showing at the cut, while the rank went on drawing that bar.
        assert got[:-1] == want[: len(got) - 1]
        assert want[len(got) - 1].startswith(got[-1]) or b"\r" + got[-1] in raw
    return got


def test_every_line_survives_pdsh_and_raw_logs_come_back(sandbox, job_dirs) -> None:
    _, state = sandbox
    nodes = [n.name for n in state.nodes]
    job, raw_dir, run = job_dirs
    started = time.monotonic()
    process = start_pdsh(nodes, raw_dir, LINES)
    router = LogRouter(run / "logs")
    controls = pump(process, router)
    router.close()
    assert process.wait(60) == 0, process.stderr.read().decode()
    assert time.monotonic() - started < 600  # no hang

    exits = {node: rec.fields for node, rec in controls if rec.text == "exit"}
    assert sorted(exits) == sorted(nodes)
    report = collect_logs(nodes, job, run / "nodes")
    assert report.ok, report.failed
    assert not raw_dir.exists()  # removed from the nodes after a verified pull

    for node in nodes:
        raw_out = (run / "nodes" / node / "stdout.raw").read_bytes()
        raw_err = (run / "nodes" / node / "stderr.raw").read_bytes()
        # byte for byte what the rank wrote
        assert hashlib.sha256(raw_out).hexdigest() == exits[node]["sha_out"]
        assert hashlib.sha256(raw_err).hexdigest() == exits[node]["sha_err"]
        entries = read_log(run / "logs" / f"{node}.log")  # also checks: no \r anywhere
        out = check_stream(entries, b"out", raw_out)
        err = check_stream(entries, b"err", raw_err)
        for name, texts in ((b"out", out), (b"err", err)):
            numbered = [t for t in texts if t.startswith(node.encode() + b" " + name + b" line ")]
            assert numbered == [b"%s %s line %d" % (node.encode(), name, i) for i in range(LINES)]
        assert b"big:" + b"x" * (1 << 20) in out
        assert b"bad utf8: \xff\xfe\xc3( \x00nul \\x41 red" in err  # escape codes removed
        assert out[-1] == b"tail without newline"
        for i in range(5000, LINES, 20000):
            finals = [t for t in err if re.match(rb"bar%d: 100%%\|#+\| 40/40" % i, t)]
            assert len(finals) == 1, i
            assert not any(re.match(rb"bar%d: +[0-9]%%" % i, t) for t in err)
        for i in range(3000, LINES, 7000):
            assert [t for t in err if t.startswith(b"manual%d " % i)] == [b"manual%d 10/10" % i]


def test_killed_half_way_keeps_what_was_written(sandbox, job_dirs) -> None:
    _, state = sandbox
    nodes = [n.name for n in state.nodes[:2]]
    job, raw_dir, run = job_dirs
    # Paced (0.2 s every 1000 lines: 8 s or more in all), so the cut lands half-way even when
    # a busy head reads the first 10,000 lines late.
    process = start_pdsh(nodes, raw_dir, 40_000, pause=0.2)
    router = LogRouter(run / "logs")
    # Each node must be well under way before the cut: under load one may start late.
    pump(process, router, stop_after_lines=10_000, nodes=nodes)
    os.killpg(process.pid, signal.SIGKILL)  # the head's fan-out dies mid-job
    pump(process, router)  # what was already in the pipe
    router.close()
    process.wait(30)
    # The ranks notice their output is gone and end.
    wait_for(lambda: not subprocess.run(["pgrep", "-f", str(raw_dir)], capture_output=True).stdout,
             30, 0.2)  # fmt: skip

    report = collect_logs(nodes, job, run / "nodes")
    assert report.ok, report.failed
    for node in nodes:
        raw_out = (run / "nodes" / node / "stdout.raw").read_bytes()
        raw_err = (run / "nodes" / node / "stderr.raw").read_bytes()
        entries = read_log(run / "logs" / f"{node}.log")
        out = check_stream(entries, b"out", raw_out, complete=False)
        check_stream(entries, b"err", raw_err, complete=False)
        assert len(out) > 2000
        assert b"tail without newline" not in raw_out  # it really was cut half-way


# ----- through `orch launch`: the real launch path ------------------------------------

RANK_PROGRAM = Path(__file__).resolve().parents[1] / "_logrank.py"
ORCH = Path(sys.executable).parent / "orch"


def launch_argv(hostfile: Path, runs: Path, launcher: str, *script: str) -> list[str]:
    return [
        str(ORCH), "launch", "-H", str(hostfile), "--launcher", launcher, "--runs-dir", str(runs),
        "--no-doctor", "--nproc-per-node", "1", "--", str(RANK_PROGRAM), *script,
    ]  # fmt: skip


def only_job(runs: Path) -> Path:
    (job,) = [p for p in runs.iterdir() if (p / "job.json").is_file()]
    return job


def raw_logs(job: Path, hosts: list[str]) -> Path:
    """Where orch launch pulled the job's raw node logs back to (and said so in job.json)."""
    record = json.loads((job / "job.json").read_text())
    assert record["node_logs"] == dict.fromkeys(hosts, "ok")
    root = RunDir(job).node_logs
    assert all((root / h / "stdout.raw").is_file() for h in hosts)
    # The nodes' copies are removed.
    assert not any(Path(node_dir(job.name, h, os.getuid())).exists() for h in hosts)
    return root


def ranks_on(entries: list[tuple[bytes, bytes]], node: str) -> list[int]:
    """The global ranks the node's agent announced (`orch rank ... rank=R`)."""
    notes = [text for tag, text in entries if tag == b"orch" and text.startswith(b"rank ")]
    assert all(b'node="%s"' % node.encode() in text for text in notes), notes
    return sorted(int(re.search(rb"\brank=(\d+)", text).group(1)) for text in notes)


def one_node_hostfile(tmp_path: Path, nodes: list[str]) -> Path:
    path = tmp_path / "hostfile"
    path.write_text("".join(f"{n} slots=1\n" for n in nodes))
    return path


@pytest.mark.slow
def test_orch_launch_keeps_every_line_of_every_rank(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    hosts = [n.name for n in state.nodes]
    copies = tmp_path / "copies"
    copies.mkdir()
    runs = tmp_path / "runs"
    hostfile = one_node_hostfile(tmp_path, hosts)
    result = subprocess.run(
        launch_argv(hostfile, runs, "pdsh", str(copies), str(LINES)),
        capture_output=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    # Not a terminal: plain prefixed lines, no \r and no escape codes.
    assert b"\r" not in result.stdout and b"\x1b" not in result.stdout
    job = only_job(runs)
    raw_root = raw_logs(job, hosts)
    try:
        seen_ranks = []
        for node in hosts:
            entries = read_log(job / "logs" / f"{node}.log")  # no \r anywhere
            (rank,) = ranks_on(entries, node)  # one slot per node
            seen_ranks.append(rank)
            # The node's launcher's own output: its own raw files, its own lines.
            check_stream(entries, b"out", (raw_root / node / "stdout.raw").read_bytes())
            check_stream(entries, b"err", (raw_root / node / "stderr.raw").read_bytes())
            # The rank's own output, on its own channel: byte for byte what it wrote.
            raw_out = (raw_root / node / f"rank{rank}.stdout.raw").read_bytes()
            raw_err = (raw_root / node / f"rank{rank}.stderr.raw").read_bytes()
            assert raw_out == (copies / f"rank{rank}.out").read_bytes(), node
            assert raw_err == (copies / f"rank{rank}.err").read_bytes(), node
            out = check_stream(entries, rank_tag(rank, 0, b"out"), raw_out)
            err = check_stream(entries, rank_tag(rank, 0, b"err"), raw_err)
            for name, texts in ((b"out", out), (b"err", err)):
                prefix = b"r%d %s line " % (rank, name)
                numbered = [t for t in texts if t.startswith(prefix)]
                assert numbered == [prefix + b"%d" % i for i in range(LINES)]
            assert b"big:" + b"x" * (1 << 20) in out
            assert b"bad utf8: \xff\xfe\xc3( \x00nul \\x41 red" in err
            assert out[-1] == b"tail without newline"  # nothing of the launcher's after it
            for i in range(5000, LINES, 20000):
                assert len([t for t in err if re.match(rb"bar%d: 100%%\|#+\| 40/40" % i, t)]) == 1
        assert sorted(seen_ranks) == list(range(len(hosts)))
    finally:
        shutil.rmtree(f"{runs_root(os.getuid())}/{job.name}", ignore_errors=True)


@pytest.mark.slow
def test_orch_launch_interrupted_half_way_keeps_what_was_written(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    hosts = [n.name for n in state.nodes[:2]]
    copies = tmp_path / "copies"
    copies.mkdir()
    runs = tmp_path / "runs"
    hostfile = one_node_hostfile(tmp_path, hosts)
    # 0.2 s of silence every 1000 lines: half the job's output is written 10 s before its
    # end, time enough for the interrupt to reach the ranks on a loaded machine.
    launch = subprocess.Popen(
        launch_argv(hostfile, runs, "torchrun", str(copies), str(LINES), "0.2"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    try:
        def half_way() -> bool:  # or ended
            # As the ranks wrote it (their own copies), not as the head has read it so far:
            # a loaded head may be far behind, the ranks done before its logs are half full.
            written = [p.stat().st_size for p in copies.glob("rank*.out")]
            grown = len(written) == len(hosts) and all(size > 1 << 20 for size in written)
            return grown or launch.poll() is not None

        wait_for(half_way, 300, 0.5)
        assert launch.poll() is None, "the job ended before it could be interrupted"
        launch.send_signal(signal.SIGINT)  # Ctrl-C on the head
        code = launch.wait(120)
    finally:
        if launch.poll() is None:
            launch.kill()
    assert code != 0
    job = only_job(runs)
    raw_root = raw_logs(job, hosts)
    try:
        for node in hosts:
            entries = read_log(job / "logs" / f"{node}.log")
            (rank,) = ranks_on(entries, node)
            raw_out = (raw_root / node / f"rank{rank}.stdout.raw").read_bytes()
            raw_err = (raw_root / node / f"rank{rank}.stderr.raw").read_bytes()
            assert b"tail without newline" not in raw_out  # it really was cut half-way
            out = check_stream(entries, rank_tag(rank, 0, b"out"), raw_out, complete=False)
            check_stream(entries, rank_tag(rank, 0, b"err"), raw_err, complete=False)
            assert len(out) > 10_000
    finally:
        shutil.rmtree(f"{runs_root(os.getuid())}/{job.name}", ignore_errors=True)
