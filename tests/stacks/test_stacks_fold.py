"""`orch stacks` on values: py-spy's output parsed, identical stacks folded across ranks,
the ranks that stand apart and their innermost frame of the user's code."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from orchestrator.stacks.fold import (
    fold_ranks,
    folded_json,
    kept_threads,
    rank_ranges,
    steady_outliers,
    user_frame,
)
from orchestrator.stacks.model import (
    BAD_OUTPUT,
    NO_PY_SPY,
    PTRACE,
    Frame,
    NodeReport,
    RankStacks,
    innermost_user_frame,
    is_library_file,
    parse_node_report,
    sample_from_raw,
    short_path,
    thread_from_dump,
)
from orchestrator.stacks.report import analyse, merged_looks, needs_another_look

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"
WAITING_PID, COMPUTING_PID = 13982, 13983  # the processes the fixtures were taken from


def dump_fixture(name: str) -> list[dict]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def rank_from(name: str, rank: int, node: str) -> RankStacks:
    threads = dump_fixture(name)
    pid = threads[0]["pid"]
    return RankStacks(rank, node, pid, tuple(thread_from_dump(t, pid) for t in threads))


@pytest.mark.parametrize(
    ("path", "library"),
    [
        ("/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", True),
        ("/usr/lib/python3/dist-packages/yaml/__init__.py", True),
        ("/usr/lib/python3.11/threading.py", True),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", True),
        ("/usr/lib64/python3.12/queue.py", True),
        ("/src/pytorch/torch/distributed/distributed_c10d.py", True),  # a torch checkout
        ("torch/nn/modules/module.py", True),
        ("<frozen importlib._bootstrap>", True),
        ("", True),
        ("/home/alice/train/stepping.py", False),
        ("/home/alice/lib/python_utils/data.py", False),
        ("train.py", False),
    ],
)
def test_library_files_are_site_packages_stdlib_and_torch(path: str, library: bool) -> None:
    assert is_library_file(path) is library


@pytest.mark.parametrize(
    ("path", "short"),
    [
        ("/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py",
         "torch/distributed/c10d_logger.py"),
        ("/usr/lib/python3.11/threading.py", "threading.py"),
        ("/home/alice/train/stepping.py", "/home/alice/train/stepping.py"),
    ],
)  # fmt: skip
def test_short_path_shows_a_library_file_from_its_package(path: str, short: str) -> None:
    assert short_path(path) == short


def test_a_dump_thread_keeps_its_frames_innermost_first_and_knows_the_main_thread() -> None:
    main, pinner = (thread_from_dump(t, WAITING_PID) for t in dump_fixture("dump_waiting"))
    assert main.main and main.idle and main.name == "MainThread"
    assert main.frames[0] == Frame(
        "all_reduce",
        "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
        3252,
    )
    assert innermost_user_frame(main.frames).where == "/home/alice/train/stepping.py:57 main"
    assert not pinner.main and pinner.idle


def test_a_raw_sample_reads_thread_frames_and_count() -> None:
    line = (FIXTURES / "record_waiting.txt").read_text().splitlines()[2]
    sample = sample_from_raw(line, WAITING_PID)
    assert sample is not None and sample.main and sample.count == 114
    assert sample.frames[0].function == "all_reduce" and sample.frames[0].line == 3252
    assert sample.frames[-1].function == "<module>"
    other = sample_from_raw("thread (7): worker;run (/a (b)/x.py:3) 2", WAITING_PID)
    assert other is not None and not other.main
    assert other.frames == (Frame("run", "/a (b)/x.py", 3),)
    assert sample_from_raw("py-spy> Sampling process", WAITING_PID) is None


def test_idle_helper_threads_are_dropped_the_main_thread_never() -> None:
    rank = rank_from("dump_waiting", 0, "n1")
    assert [t.name for t in rank.threads] == ["MainThread", "Thread-1 (_pin_memory_loop)"]
    assert [t.name for t in kept_threads(rank)] == ["MainThread"]


def _six_ranks() -> list[RankStacks]:
    """Five ranks waiting in all_reduce (thread names differ), one still computing."""
    ranks = []
    for number in range(6):
        node = f"n{number // 2 + 1}"
        if number == 3:
            ranks.append(rank_from("dump_computing", number, node))
            continue
        threads = copy.deepcopy(dump_fixture("dump_waiting"))
        threads[0]["thread_name"] = f"rank-{number}"  # names are ignored when folding
        ranks.append(
            RankStacks(number, node, WAITING_PID, tuple(thread_from_dump(t, WAITING_PID)
                                                        for t in threads))
        )  # fmt: skip
    return ranks


def test_identical_stacks_fold_into_one_block_and_the_odd_rank_stands_apart() -> None:
    folded = fold_ranks(_six_ranks())
    assert [block.rank_numbers for block in folded.blocks] == [(3,), (0, 1, 2, 4, 5)]
    assert folded.majority is folded.blocks[-1]
    assert folded.majority.nodes == ("n1", "n2", "n3")
    [outlier] = folded.outliers
    assert (outlier.rank, outlier.node) == (3, "n2")
    assert outlier.frame.where == "/home/alice/train/stepping.py:29 compute"
    doc = folded_json(folded)
    assert doc["stand_apart"] == [
        {"rank": 3, "node": "n2", "frame": "/home/alice/train/stepping.py:29 compute"}
    ]
    assert doc["blocks"][1]["majority"] and doc["blocks"][1]["ranks"] == [0, 1, 2, 4, 5]
    json.dumps(doc)


def test_no_majority_when_two_blocks_are_as_big_and_failed_ranks_are_kept_apart() -> None:
    ranks = [
        rank_from("dump_waiting", 0, "n1"),
        rank_from("dump_computing", 1, "n1"),
        RankStacks(2, "n2", 99, error="Permission Denied", kind=PTRACE),
    ]
    folded = fold_ranks(ranks)
    assert folded.majority is None and folded.outliers == ()
    assert len(folded.blocks) == 2
    assert [rank.rank for rank in folded.failed] == [2]


def test_a_rank_without_user_frames_shows_its_innermost_frame() -> None:
    threads = dump_fixture("dump_waiting")
    threads[0]["frames"] = threads[0]["frames"][:2]  # torch only
    rank = RankStacks(0, "n1", WAITING_PID, tuple(thread_from_dump(t, WAITING_PID)
                                                  for t in threads))  # fmt: skip
    assert user_frame(rank).function == "all_reduce"


@pytest.mark.parametrize(
    ("numbers", "text"),
    [([0, 1, 2, 4, 5], "0-2,4-5"), ([3], "3"), ([7, 5, 6, 1], "1,5-7"), ([], "")],
)
def test_rank_ranges_fold_like_a_node_set(numbers: list[int], text: str) -> None:
    assert rank_ranges(numbers) == text


# ----- a node's report -------------------------------------------------------------------
def test_a_node_report_parses_every_rank() -> None:
    doc = {
        "node": "n1", "job_id": "j", "mode": "dump", "py_spy": "/opt/venv/bin/py-spy",
        "ranks": [
            {"rank": 1, "pid": COMPUTING_PID, "threads": dump_fixture("dump_computing")},
            {"rank": 0, "pid": 5, "error": "Permission Denied: Try running again",
             "kind": PTRACE},
        ],
    }  # fmt: skip
    report = parse_node_report("n1", json.dumps(doc), "/opt/venv/bin/python", "j")
    assert not report.ok and report.error is None
    computing, refused = report.ranks
    assert computing.ok and computing.threads[0].main and not computing.threads[0].idle
    assert refused.kind == PTRACE and "ptrace_scope" in refused.hint
    assert "CAP_SYS_PTRACE" in refused.hint


def test_a_node_without_py_spy_names_its_ranks_and_the_fix() -> None:
    doc = {
        "node": "n1", "job_id": "j", "py_spy": None, "kind": NO_PY_SPY,
        "error": "py-spy not found beside /opt/venv/bin/python or on PATH",
        "ranks": [{"rank": 0, "pid": 10}, {"rank": 1, "pid": 11}],
    }  # fmt: skip
    report = parse_node_report("n1", json.dumps(doc), "/opt/venv/bin/python", "j")
    assert report.kind == NO_PY_SPY and report.error.startswith("n1: py-spy not found")
    assert "/opt/venv/bin/python -m pip install py-spy" in report.hint
    assert [(r.rank, r.ok) for r in report.ranks] == [(0, False), (1, False)]


def test_an_unreadable_answer_is_a_finding_not_a_traceback() -> None:
    report = parse_node_report("n1", "Traceback (most recent call last):", "python3", "j")
    assert report.kind == BAD_OUTPUT and report.error.startswith("n1: unreadable answer")


def _four_ranks(apart: tuple[int, ...], count: int = 4) -> list[RankStacks]:
    """Ranks 0-3 (or `count`), two per node: those in `apart` computing, the others
    waiting."""
    return [
        rank_from("dump_computing" if number in apart else "dump_waiting", number,
                  f"n{number // 2 + 1}")
        for number in range(count)
    ]  # fmt: skip


def test_a_rank_caught_apart_once_is_not_named_when_a_second_look_names_another() -> None:
    first = fold_ranks(_four_ranks((3,), count=6))
    second = fold_ranks(_four_ranks((1, 3), count=6))  # rank 1 caught between two calls
    assert [o.rank for o in steady_outliers(second, [first])] == [3]
    # A rank the first look could not read does not count against it.
    unread = fold_ranks([r for r in _four_ranks((3,), count=6) if r.rank != 3])
    assert [o.rank for o in steady_outliers(second, [unread])] == [3]
    # Nothing steady: every rank apart in the last look is named.
    assert [o.rank for o in steady_outliers(second, [fold_ranks(_four_ranks((0,), 6))])] == [1, 3]


def _node(name: str, ranks: list[RankStacks], error: str | None = None) -> NodeReport:
    mine = tuple(rank for rank in ranks if rank.node == name)
    return NodeReport(name, () if error else mine, error=error, kind="timeout" if error else None)


def test_a_node_that_did_not_answer_the_first_look_is_read_from_the_second() -> None:
    ranks = _four_ranks((3,))
    first = analyse("j1", "t1", None, [_node("n1", ranks), _node("n2", ranks, "no answer")])
    assert needs_another_look(first)
    assert first.folded.outliers == ()  # the stuck rank's node never answered
    second = analyse("j1", "t2", None, [_node("n1", ranks, "no answer"), _node("n2", ranks)])
    merged = merged_looks(first, second)
    assert merged.ok and merged.taken_at == "t2"
    assert [o.rank for o in merged.folded.outliers] == [3]
    assert not needs_another_look(merged)
    # Two blocks apart from the majority, or no majority at all: look again.
    assert needs_another_look(analyse("j1", "t", None, [_node("n1", _four_ranks((0, 1)))]))
    three = [*_four_ranks((3,)), RankStacks(4, "n2", 5, error="gone", kind="gone")]
    assert needs_another_look(analyse("j1", "t", None, [_node("n1", three), _node("n2", three)]))
