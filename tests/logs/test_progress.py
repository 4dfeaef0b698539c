"""Progress samples kept as a job runs (logs/progress.py): what a rank's bar or line says,
and how the samples stay bounded."""

from __future__ import annotations

import itertools
import json

import pytest

from orchestrator.logs.progress import (
    ProgressRecorder,
    bar_sample,
    line_sample,
    read_samples,
)
from orchestrator.records.job import PROGRESS_FILE
from orchestrator.records.moments import MomentKind
from orchestrator.records.rundir import RunDir


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (b"train:  45%|####5     | 45/100 [00:01<00:02, 30.12it/s]", (45, 100, 30.12)),
        (b" 12%|#2        | 12/100 [00:10<01:13,  1.25s/it]", (12, 100, 0.8)),
        (b"100%|##########| 100/100 [00:03<00:00, 33.2samples/s]", (100, 100, 33.2)),
        (b"45it [00:01, 30.12it/s]", (45, None, 30.12)),
        (b"  0%|          | 0/100 [00:00<?, ?it/s]", (0, 100, None)),
        (b"loading the model...", None),
    ],
)
def test_a_bar_frame_gives_its_count_total_and_rate(frame, expected):
    assert bar_sample(frame) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"r0 step 12 loss 0.25", (12, None, None)),
        (b"Step: 40/200 loss=1.2", (40, 200, None)),
        (b"iter 7", (7, None, None)),
        (b"epoch 3 done, written to /tmp/2026/11", None),
        (b"100%|##########| 50/50 [00:03<00:00, 16.1it/s]", (50, 50, 16.1)),
    ],
)
def test_a_line_gives_its_step(line, expected):
    assert line_sample(line) == expected


def _samples(tmp_path):
    return [json.loads(line) for line in (tmp_path / PROGRESS_FILE).read_text().splitlines()]


def test_at_most_one_sample_per_rank_per_second(tmp_path):
    recorder = ProgressRecorder(RunDir(tmp_path))
    for tenth in range(50):  # 5 s, every rank printing 10 lines a second
        recorder.now = 100.0 + tenth / 10
        for rank in range(3):
            recorder.line("n1", f"{rank}/{rank}", b"step %d" % tenth)
            recorder.frame("n1", f"{rank}/{rank}", b"%d/50 [00:01<00:01, 10.0it/s]" % tenth)
    recorder.close()
    samples = _samples(tmp_path)
    for rank in range(3):
        times = [s["t"] for s in samples if s["rank"] == rank]
        assert times == [100.0, 101.0, 102.0, 103.0, 104.0, 104.9]  # and the last one seen
    assert [s.n for s in read_samples(tmp_path) if s.rank == 0] == [0, 10, 20, 30, 40, 49]


def test_the_job_s_end_samples_each_rank_s_last_bar_when_its_last_line_has_no_count(tmp_path):
    recorder = ProgressRecorder(RunDir(tmp_path), now=1.0)
    recorder.frame("n1", "0/0", b"10/30 [00:01<00:02, 10.0it/s]")
    recorder.now = 1.5
    recorder.frame("n1", "0/0", b"30/30 [00:03<00:00, 10.0it/s]")
    recorder.line("n1", "0/0", b"rank 0 done")
    recorder.close()
    assert [(s["t"], s["n"]) for s in _samples(tmp_path)] == [(1.0, 10), (1.5, 30)]


def test_a_line_without_a_step_leaves_the_sample_to_the_next_one(tmp_path):
    recorder = ProgressRecorder(RunDir(tmp_path), now=10.0)
    recorder.line("n1", "0/0", b"loading data")
    recorder.line("n1", "0/0", b"step 3")
    recorder.close()
    assert [(s["t"], s["n"]) for s in _samples(tmp_path)] == [(10.0, 3)]


def test_the_cap_holds_and_a_long_job_is_drawn_evenly_to_its_end(tmp_path):
    cap = 40
    recorder = ProgressRecorder(RunDir(tmp_path), cap=cap)
    for second in range(2000):
        recorder.now = float(second)
        for rank in range(2):
            recorder.line("n1", f"{rank}/{rank}", b"step %d" % second)
    recorder.close()
    samples = _samples(tmp_path)
    assert cap // 2 <= len(samples) <= cap + 2  # the cap, and each rank's last
    for rank in range(2):
        times = [s["t"] for s in samples if s["rank"] == rank]
        assert times[0] == 0.0 and times[-1] == 1999.0  # from its start to its end
        gaps = {b - a for a, b in itertools.pairwise(times[:-1])}
        assert gaps == {128.0}  # evenly: every other sample went, each time the cap was met
    assert (tmp_path / PROGRESS_FILE).stat().st_mode & 0o777 == 0o600


def test_the_launchers_lines_are_no_rank_s_progress(tmp_path):
    recorder = ProgressRecorder(RunDir(tmp_path), now=5.0)
    recorder.line("n1", "", b"[launcher] step 3")
    recorder.close()
    assert not (tmp_path / PROGRESS_FILE).exists()


def test_first_and_last_output_and_heartbeat_become_moments(tmp_path):
    recorder = ProgressRecorder(RunDir(tmp_path), now=1.0)
    recorder.line("n1", "", b"launcher says hello")
    recorder.now = 2.0
    recorder.frame("n1", "0/0", b"1/10 [")
    recorder.now = 3.0
    recorder.line("n2", "1/0", b"hi")
    recorder.heartbeat("n2")
    recorder.now = 7.5
    recorder.line("n1", "0/0", b"bye")
    got = {(m.kind, m.node, m.rank): m.t for m in recorder.close()}
    assert got == {
        (MomentKind.FIRST_OUTPUT, "n1", 0): 2.0, (MomentKind.LAST_OUTPUT, "n1", 0): 7.5,
        (MomentKind.FIRST_OUTPUT, "n2", 1): 3.0, (MomentKind.LAST_OUTPUT, "n2", 1): 3.0,
        (MomentKind.FIRST_OUTPUT, "n1", None): 1.0, (MomentKind.LAST_OUTPUT, "n1", None): 7.5,
        (MomentKind.FIRST_OUTPUT, "n2", None): 3.0, (MomentKind.LAST_OUTPUT, "n2", None): 3.0,
        (MomentKind.LAST_HEARTBEAT, "n2", None): 3.0,
    }  # fmt: skip


def test_the_samples_are_the_users_alone_and_a_planted_link_is_not_followed(tmp_path):
    recorder = ProgressRecorder(RunDir(tmp_path), now=1.0)
    recorder.line("n1", "0/0", b"step 1")
    recorder.close()
    assert (tmp_path / PROGRESS_FILE).stat().st_mode & 0o777 == 0o600

    other = tmp_path / "other"
    other.mkdir()
    (other / PROGRESS_FILE).symlink_to(tmp_path / "elsewhere")
    planted = ProgressRecorder(RunDir(other), now=1.0)
    planted.line("n1", "0/0", b"step 1")  # refused, and the log path goes on
    planted.now = 2.0
    planted.line("n1", "0/0", b"step 2")
    planted.close()
    assert not (tmp_path / "elsewhere").exists()
    assert planted.problem is not None and planted.samples == 0


def test_a_sample_that_cannot_be_written_stops_sampling_not_the_job(tmp_path):
    recorder = ProgressRecorder(RunDir(tmp_path / "gone"), now=1.0)
    recorder.line("n1", "0/0", b"step 1")  # no such directory: nothing raised
    recorder.now = 5.0
    recorder.line("n1", "0/0", b"step 9")
    moments = recorder.close()
    assert recorder.problem is not None and "progress samples stopped" in recorder.problem
    assert {m.kind for m in moments} == {"first-output", "last-output"}  # still noted


def test_unreadable_sample_lines_are_skipped(tmp_path):
    (tmp_path / PROGRESS_FILE).write_text(
        '{"t": 1, "node": "n1", "rank": 0, "n": 3, "total": null, "rate": null}\n'
        '{"t": 2, "node": "n1", "rank": 0, "n": \n'  # cut short by a crash
        '["not", "a", "sample"]\n'
    )
    assert [(s.rank, s.n) for s in read_samples(tmp_path)] == [(0, 3)]
