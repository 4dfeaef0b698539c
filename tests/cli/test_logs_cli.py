"""`orch logs JOB`: what a user sees, through the real `orch` command."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from launch_support import wait_for

from orchestrator.cli.main import main
from orchestrator.logs.writer import NodeLogWriter
from orchestrator.records.job import JobRecord, process_start_time
from orchestrator.records.rundir import RunDir

ORCH = Path(sys.executable).parent / "orch"
JOB = "20261121-230000-abc123"


class Result:
    def __init__(self, returncode: int, stdout: bytes, stderr: bytes) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def orch(capfdbinary):
    """`orch ARGS --runs-dir RUNS` in this process (the CLI's start-up cost is paid once)."""

    def run(*args: str, runs: Path) -> Result:
        capfdbinary.readouterr()
        try:
            main([*args, "--runs-dir", str(runs)])
            code = 0
        except SystemExit as done:
            code = int(done.code or 0)
        out, err = capfdbinary.readouterr()
        return Result(code, out, err)

    return run


def make_job(runs: Path, state: str = "succeeded", head_pid: int = 0) -> RunDir:
    run = RunDir(runs / JOB).create()
    record = JobRecord(
        id=JOB, state=state, launcher="pdsh", command=("train.py",), hosts=("n1", "n2"),
        workdir="/tmp", started_at="2026-11-21T23:00:00+00:00", head_pid=head_pid,
        head_start=process_start_time(head_pid) if head_pid else None,
    )  # fmt: skip
    run.save(record)
    return run


def write_log(path: Path, entries: list[tuple[float, str, bytes]]) -> None:
    now = [0.0]
    with NodeLogWriter(path, clock=lambda: now[0]) as writer:
        for t, stream, data in entries:
            now[0] = t
            writer.write_wire(ord("L"), ord(stream[0]), data)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    run = make_job(tmp_path)
    write_log(run.logs / "n1.log", [(100.0, "out", b"n1 first"), (102.0, "err", b"n1 \xff third")])
    write_log(run.logs / "n2.log", [(101.0, "out", b"n2 second"), (103.0, "out", b"n2 fourth")])
    return tmp_path


def texts(stdout: bytes) -> list[bytes]:
    return [line.split(b" ", 3)[-1] if b" " in line else line for line in stdout.splitlines()]


def test_by_node_and_by_time(runs: Path, orch) -> None:
    by_node = orch("logs", JOB, runs=runs)
    assert by_node.returncode == 0, by_node.stderr
    assert texts(by_node.stdout) == [b"n1 first", b"n1 \xff third", b"n2 second", b"n2 fourth"]
    assert by_node.stdout.startswith(b"n1 1970-01-01T00:01:40.000Z out n1 first\n")
    by_time = orch("logs", JOB[:10], "--by-time", runs=runs)  # a unique prefix is enough
    assert texts(by_time.stdout) == [b"n1 first", b"n2 second", b"n1 \xff third", b"n2 fourth"]
    assert [line.split(b" ")[0] for line in by_time.stdout.splitlines()] == [
        b"n1", b"n2", b"n1", b"n2",
    ]  # fmt: skip


def test_one_node_is_printed_as_its_file(runs: Path, orch) -> None:
    result = orch("logs", JOB, "--nodelist", "n2", runs=runs)
    assert result.returncode == 0
    assert result.stdout == (runs / JOB / "logs" / "n2.log").read_bytes()
    # --node, its earlier spelling, is a hidden alias of -w/--nodelist.
    assert orch("logs", JOB, "--node", "n2", runs=runs).stdout == result.stdout


def test_a_node_set_selects_the_nodes_it_names(runs: Path, orch) -> None:
    both = orch("logs", JOB, "-w", "n[1-2]", runs=runs)
    assert both.returncode == 0
    assert both.stdout == orch("logs", JOB, runs=runs).stdout


def test_unknown_node_is_a_usage_error(runs: Path, orch) -> None:
    result = orch("logs", JOB, "-w", "n9", runs=runs)
    assert result.returncode == 2
    assert b"no node n9" in result.stderr and b"n1, n2" in result.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["-n", "50"], b"hint: for the last 50: orch logs JOB | tail -n 50"),
        (["-w", "50"], b"hint: for the last 50 lines: orch logs JOB | tail -n 50"),
        (["-n", "n2"], b"hint: did you mean -w n2?"),
    ],
)
def test_a_line_count_or_the_old_short_node_flag_is_refused_with_what_to_type(
    runs: Path, orch, argv: list[str], said: bytes
) -> None:
    result = orch("logs", JOB, *argv, runs=runs)
    assert (result.returncode, result.stdout) == (2, b"")
    assert said in result.stderr


def test_raw_prints_pulled_back_files_and_names_missing_nodes(runs: Path, orch) -> None:
    raw_dir = RunDir(runs / JOB).node_logs / "n1"
    raw_dir.mkdir(parents=True)
    (raw_dir / "stdout.raw").write_bytes(b"\rraw 1\rraw 2\n\xff")
    result = orch("logs", JOB, "--raw", runs=runs)
    assert result.returncode == 0
    assert b"==> n1/stdout.raw <==\n\rraw 1\rraw 2\n\xff" in result.stdout
    assert b"no raw logs for n2" in result.stderr
    missing = orch("logs", JOB, "--raw", "-w", "n2", runs=runs)
    assert missing.returncode == 1
    assert b"error:" in missing.stderr and b"/tmp/orch-<uid>/runs/" + JOB.encode() in missing.stderr


@pytest.mark.process
def test_follow_prints_new_lines_and_ends_with_the_job(tmp_path: Path) -> None:
    # A stand-in head process: the record counts as running while it lives.
    head = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = make_job(tmp_path, state="running", head_pid=head.pid)
        writer = NodeLogWriter(run.logs / "n1.log", flush_interval=0)
        follower = subprocess.Popen(
            [str(ORCH), "logs", JOB, "-f", "-w", "n1", "--runs-dir", str(tmp_path)],
            stdout=subprocess.PIPE,
        )
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.extend(follower.stdout))
        reader.start()
        for i in range(5):  # each line is printed before the next is written
            writer.write_wire(ord("L"), ord("o"), b"step %d" % i)
            writer.flush()
            assert wait_for(lambda i=i: len(got) > i, 10, 0.02), got
        assert follower.poll() is None  # still following a running job
        writer.write_wire(ord("L"), ord("o"), b"last words")
        writer.close()
        run.save(replace(run.load(), state="succeeded"))
        assert follower.wait(15) == 0
        reader.join(5)
        assert [line.split(b" ", 2)[2] for line in got] == [
            *(b"step %d\n" % i for i in range(5)), b"last words\n",
        ]  # fmt: skip
    finally:
        head.kill()
        head.wait()


def test_raw_and_follow_together_is_a_usage_error(runs: Path, orch) -> None:
    result = orch("logs", JOB, "--raw", "--follow", runs=runs)
    assert result.returncode == 2
    assert b"--raw and --follow cannot be combined" in result.stderr
    assert b"follow the head-side logs instead" in result.stderr
    assert result.stdout == b""


@pytest.mark.process
def test_piped_into_head_is_not_an_error(runs: Path) -> None:
    # `orch logs JOB | head -1`: the reader leaves early.
    shell = f"{ORCH} logs {JOB} --runs-dir {runs} | head -1; echo ${{PIPESTATUS[0]}}"
    result = subprocess.run(["bash", "-c", shell], capture_output=True, timeout=60)
    assert result.stdout.splitlines()[-1] == b"0"
    assert b"Traceback" not in result.stderr


def test_no_job_record_names_the_directory(tmp_path: Path, orch) -> None:
    result = orch("logs", "nope", runs=tmp_path)
    assert result.returncode == 2
    assert str(tmp_path).encode() in result.stderr


def test_a_rank_is_known_by_its_lines_and_the_records_ranks_not_only_its_start_note(
    tmp_path: Path, orch
) -> None:
    run = make_job(tmp_path)  # its record lists no ranks, and no start note is in the logs
    write_log(run.logs / "n1.log", [(4.0, "out", b"n1's launcher")])
    with NodeLogWriter(run.logs / "n2.log", clock=lambda: 5.0) as writer:
        writer.write_wire(ord("L"), ord("o"), b"rank five says hi", rank=b"5/1")
    shown = orch("logs", JOB, "--rank", "5", runs=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert texts(shown.stdout) == [b"rank five says hi"]
    never = orch("logs", JOB, "--rank", "6", runs=tmp_path)
    assert never.returncode == 1 and b"rank 6 never started" in never.stderr
