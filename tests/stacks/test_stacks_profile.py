"""`orch stacks --profile` on values: which frames are communication, each rank's share of
samples inside it, and the straggler verdict with its margin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.stacks.model import Frame, NodeReport, RankStacks, sample_from_raw
from orchestrator.stacks.profile import (
    STRAGGLER_MARGIN,
    RankProfile,
    is_comm_frame,
    rank_profile,
    straggler_verdict,
    verdict_words,
    waited_for_words,
)
from orchestrator.stacks.report import analyse, result_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"
SITE = "/opt/venv/lib/python3.11/site-packages/"
C10D = SITE + "torch/distributed/distributed_c10d.py"


@pytest.mark.parametrize(
    ("frame", "comm"),
    [
        (Frame("all_reduce", C10D, 3252), True),
        (Frame("barrier", C10D, 4100), True),
        (Frame("broadcast", C10D, 2800), True),
        (Frame("all_gather_into_tensor", C10D, 3700), True),
        (Frame("Work.wait", SITE + "torch/distributed/distributed_c10d.py", 10), True),
        (Frame("all_reduce", "/src/pytorch/torch/distributed/distributed_c10d.py", 1), True),
        (Frame("all_reduce", SITE + "deepspeed/comm/comm.py", 120), True),
        (Frame("inference_all_reduce", SITE + "deepspeed/comm/torch.py", 160), True),
        (Frame("gloo::transport::tcp::Pair::recv", "libtorch_cpu.so", 0), True),
        (Frame("ncclAllReduce", "libnccl.so.2", 0), True),
        (Frame("_exception_logger.<locals>.wrapper", SITE + "torch/distributed/c10d_logger.py",
               83), False),
        (Frame("init_process_group", C10D, 1500), False),
        (Frame("get_rank", C10D, 2000), False),
        (Frame("all_reduce", "/home/alice/train/my_collectives.py", 3), False),  # the user's
        (Frame("check_nccl_env", "/home/alice/train/setup.py", 9), False),
        (Frame("forward", SITE + "torch/nn/modules/module.py", 1700), False),
        (Frame("wait", "/usr/lib/python3.11/threading.py", 320), False),
    ],
)  # fmt: skip
def test_communication_frames(frame: Frame, comm: bool) -> None:
    assert is_comm_frame(frame) is comm


def _sampled(name: str, rank: int, node: str, pid: int) -> RankStacks:
    lines = (FIXTURES / name).read_text().splitlines()
    samples = tuple(s for line in lines if (s := sample_from_raw(line, pid)) is not None)
    return RankStacks(rank, node, pid, samples=samples)


def test_a_waiting_rank_spends_most_samples_in_communication() -> None:
    profile = rank_profile(_sampled("record_waiting.txt", 0, "n1", 13982))
    assert profile.samples == 149 and profile.comm_samples == 115
    assert profile.comm_share > 0.75
    assert profile.hottest.where == "/home/alice/train/stepping.py:29 compute"


def test_the_straggler_computes_and_barely_waits() -> None:
    profile = rank_profile(_sampled("record_straggler.txt", 1, "n1", 13983))
    assert profile.samples == 149 and profile.comm_samples == 5
    assert profile.hottest.where == "/home/alice/train/stepping.py:29 compute"
    assert profile.hottest_samples == 143


def test_only_the_main_thread_counts_when_it_was_sampled() -> None:
    lines = [
        "thread (10): MainThread;main (/home/a/t.py:3);all_reduce (" + C10D + ":3252) 8",
        "thread (10): MainThread;main (/home/a/t.py:5) 2",
        "thread (11): Thread-1;run (/usr/lib/python3.11/threading.py:982) 90",
    ]
    samples = tuple(sample_from_raw(line, 10) for line in lines)
    profile = rank_profile(RankStacks(0, "n1", 10, samples=samples))
    assert (profile.samples, profile.comm_samples) == (10, 8)


def _profile(rank: int, share: float, samples: int = 500) -> RankProfile:
    return RankProfile(rank, f"n{rank // 2 + 1}", samples, round(share * samples), None, 0)


@pytest.mark.parametrize(
    ("shares", "straggler"),
    [
        ([0.80, 0.82, 0.78, 0.10, 0.81, 0.79], 3),  # one rank computes while the rest wait
        ([0.05, 0.60, 0.62], 0),
        ([0.98, 0.98, 0.99, 0.98, 0.97, 0.98], None),  # all ranks in all_reduce: balanced
        ([0.30, 0.35, 0.33, 0.31], None),  # balanced, little waiting
        ([0.10, 0.12, 0.80, 0.81], None),  # two equally slow ranks: neither stands alone
        ([0.50, 0.69], None),  # 19 points: under the margin
        ([0.50, 0.70], 0),  # 20 points: the margin itself
        ([0.4], None),  # one rank: nothing to compare with
        ([], None),
    ],
)
def test_straggler_verdict(shares: list[float], straggler: int | None) -> None:
    verdict = straggler_verdict([_profile(rank, share) for rank, share in enumerate(shares)])
    assert (verdict.straggler.rank if verdict.straggler else None) == straggler
    assert verdict.margin == STRAGGLER_MARGIN
    if straggler is None:
        assert verdict.reason


def test_ranks_without_samples_are_left_out_of_the_verdict() -> None:
    profiles = [_profile(0, 0.8), _profile(1, 0.0, samples=0), _profile(2, 0.82)]
    assert straggler_verdict(profiles).straggler is None


def test_the_profile_document_names_the_straggler_and_its_hottest_frame() -> None:
    nodes = [
        NodeReport("n1", (_sampled("record_waiting.txt", 0, "n1", 13982),)),
        NodeReport("n2", (_sampled("record_straggler.txt", 1, "n2", 13983),)),
        NodeReport("n3", error="n3: connection refused", kind="unreachable", hint="start sshd"),
    ]
    result = analyse("job", "2026-11-23T00:00:00+00:00", 10.0, nodes)
    assert not result.ok
    doc = json.loads(json.dumps(result_json(result)))
    assert doc["mode"] == "profile" and doc["seconds"] == 10.0
    assert doc["profile"]["straggler"] == {
        "rank": 1, "node": "n2", "comm_share": round(5 / 149, 4),
        "hottest_user_frame": "/home/alice/train/stepping.py:29 compute",
    }  # fmt: skip
    assert [n["ok"] for n in doc["nodes"]] == [True, True, False]
    assert doc["nodes"][2]["error"] == "n3: connection refused"


def test_the_rank_the_others_wait_for_is_said_with_their_share_and_where_it_stands() -> None:
    profiles = [_profile(0, 0.61), _profile(1, 0.68), _profile(2, 0.09), _profile(3, 0.64)]
    found = straggler_verdict(profiles)
    assert found.straggler is not None
    assert verdict_words(profiles, found) == (
        "waited for: rank 2 on n2 (the other ranks wait 61-68% of their time in "
        "communication, it 9%)"
    )
    same = waited_for_words(4, "n3", 0.1, [0.7, 0.7], "train.py:40 step")
    assert same == ("waited for: rank 4 on n3 (the other ranks wait 70% of their time in "
                    "communication, it 10%), at train.py:40 step")  # fmt: skip


def test_a_profile_with_no_rank_apart_says_so_and_why() -> None:
    profiles = [_profile(0, 0.30), _profile(1, 0.35)]
    said = verdict_words(profiles, straggler_verdict(profiles))
    assert said.startswith("no rank stands apart: no clear straggler: rank 0 waits least")
