"""The hang threshold learned from a job's own pace (outcome/pace.py), the verdict using it
when no --hang-timeout is given, and what users type for it (specs/hang.py). On values."""

from __future__ import annotations

import pytest

from orchestrator.errors import UsageError
from orchestrator.outcome.events import NodeHeard, QuietLooked, RankOutput, Tick, WatchSettings
from orchestrator.outcome.pace import FLOOR_S, START_FLOOR_S, HangPace, PaceSeed
from orchestrator.outcome.quiet import Activity, QuietFinding, RankFinding
from orchestrator.outcome.verdict import JobVerdict
from orchestrator.specs.hang import hang_timeout_value, learned_floors
from orchestrator.specs.recipe import Recipe


def _paced(gap: float, outputs: int) -> HangPace:
    pace = HangPace()
    for step in range(outputs):
        pace.output(step * gap)
    return pace


def test_before_the_job_shows_a_pace_the_start_up_floor_holds():
    pace = _paced(1.0, 5)
    assert pace.threshold().to_json() == {"seconds": START_FLOOR_S, "source": "start-up floor"}


def test_lines_before_the_first_step_are_start_up_however_many():
    pace = HangPace()
    for at in range(200):  # a launcher's and a library's banners, a data preparation's log
        pace.output(at * 0.1, stepping=False)
    assert pace.threshold().source == "start-up floor"
    for at in range(200, 230):
        pace.output(at * 0.1, stepping=True)
    assert pace.threshold().to_json() == {"seconds": FLOOR_S, "source": "floor"}


def test_a_fast_job_gets_the_floor_and_a_slow_one_ten_times_its_gap():
    assert _paced(0.5, 100).threshold().to_json() == {"seconds": FLOOR_S, "source": "floor"}
    slow = _paced(30.0, 40).threshold()
    assert (slow.seconds, slow.source) == (300.0, "learned from 40 outputs")


def test_the_95th_percentile_gap_counts_not_a_rare_long_one():
    pace = HangPace()
    at = 0.0
    for step in range(200):
        at += 100.0 if step == 50 else 20.0  # one evaluation of 100 s among 20 s steps
        pace.output(at)
    assert pace.threshold().seconds == 200.0


def test_quiet_work_raises_the_threshold_above_it_and_a_given_one_is_kept():
    pace = _paced(0.5, 100)
    pace.worked(400.0)
    assert pace.threshold().to_json() == {"seconds": 600.0, "source": "quiet work seen"}
    given = HangPace(given=45.0)
    given.worked(400.0)
    assert given.threshold().to_json() == {"seconds": 45.0, "source": "given"}


def test_a_restart_starts_from_what_the_attempt_before_learned():
    seed = _paced(30.0, 40).seed_for_next()
    assert seed == PaceSeed(30.0, 0.0)
    restarted = HangPace(seed=seed)
    assert restarted.threshold().source == "start-up floor"  # its own start-up first
    restarted.output(0.0, stepping=True)
    assert restarted.threshold().to_json() == {"seconds": 300.0,
                                               "source": "an earlier attempt's pace"}  # fmt: skip


def test_the_verdict_looks_only_beyond_the_learned_threshold_and_says_it():
    verdict = JobVerdict(("n1",), WatchSettings(hang_learned=True), head_launcher=False)
    for at in range(0, 60):  # a step a second: the floor of 120 s holds
        verdict.feed(NodeHeard("n1", float(at)))
        verdict.feed(RankOutput(float(at), stepping=True))
    looks = []
    for at in range(60, 181, 2):
        decisions = [verdict.feed(NodeHeard("n1", float(at))), verdict.feed(Tick(float(at)))]
        looks += [at for d in decisions if d.look]
    assert looks == [174]  # 59 s + 120 s, less the look's lead (6 s)
    stuck = RankFinding(0, "n1", Activity.IDLE, None, "idle, stuck")
    failure = verdict.feed(QuietLooked(QuietFinding((stuck,), 3.0), 180.0, 183.0)).tear_down
    assert failure.reason.startswith("hang: no rank wrote anything for 124 s (beyond 120 s: "
                                     "floor) and none is working (rank 0 idle, stuck)")  # fmt: skip


def test_off_and_no_learning_never_look():
    verdict = JobVerdict(("n1",), WatchSettings(), head_launcher=False)
    assert verdict.hangs.threshold is None
    for at in range(0, 2000, 5):
        assert not verdict.feed(NodeHeard("n1", float(at))).look
        assert not verdict.feed(Tick(float(at))).look


@pytest.mark.parametrize(("typed", "value"), [
    ("auto", "auto"), ("OFF", "off"), ("600", 600.0), ("10m", 600.0), (90, 90.0), (None, None),
])  # fmt: skip
def test_hang_timeout_is_auto_off_or_a_duration(typed, value):
    assert hang_timeout_value(typed) == value


def test_a_bad_hang_timeout_says_what_it_takes():
    with pytest.raises(UsageError) as caught:
        hang_timeout_value("sometimes")
    assert caught.value.message == "--hang-timeout 'sometimes' is neither auto, off nor a duration"
    assert "auto (learned from the job's pace), auto:1m:20m, off, 600 or 10m" in caught.value.hint
    with pytest.raises(UsageError):
        hang_timeout_value("0.5")
    recipe = {"name": "t", "script": "t.py"}
    assert Recipe.model_validate({**recipe, "hang_timeout": "15m"}).hang_timeout == 900.0
    assert Recipe.model_validate({**recipe, "hang_timeout": "off"}).hang_timeout == "off"


@pytest.mark.parametrize(("typed", "value", "floors"), [
    ("auto", "auto", (FLOOR_S, START_FLOOR_S)),
    ("auto:30s", "auto:30:600", (30.0, 600.0)),
    ("AUTO:1m:20m", "auto:60:1200", (60.0, 1200.0)),
    ("auto:15m", "auto:900:900", (900.0, 900.0)),  # the start-up floor is never the lower
    ("600", 600.0, None), ("off", "off", None),
])  # fmt: skip
def test_auto_takes_its_floors_and_keeps_them_in_one_word(typed, value, floors):
    assert hang_timeout_value(typed) == value
    assert learned_floors(value) == floors
    assert hang_timeout_value(value) == value  # as the batch script says it again


@pytest.mark.parametrize("typed", ["auto:", "auto:1m:2m:3m", "auto:soon", "auto:0.5"])
def test_floors_that_are_not_durations_are_refused(typed):
    with pytest.raises(UsageError) as caught:
        hang_timeout_value(typed)
    assert caught.value.message.startswith(f"--hang-timeout {typed!r}: ")
    assert "auto:1m:20m" in caught.value.hint


def test_the_verdict_looks_at_the_floors_it_was_given():
    settings = WatchSettings(hang_learned=True, hang_floors=(10.0, 30.0))
    verdict = JobVerdict(("n1",), settings, head_launcher=False)
    verdict.feed(NodeHeard("n1", 0.0))
    assert verdict.hangs.threshold.to_json() == {"seconds": 30.0, "source": "start-up floor"}
    looks = []
    for at in range(0, 40):  # a job that prints nothing: the start-up floor holds
        decisions = [verdict.feed(NodeHeard("n1", float(at))), verdict.feed(Tick(float(at)))]
        looks += [at for d in decisions if d.look]
    assert looks[:1] == [28]  # 30 s of quiet since the node was first heard, less a tenth
    stepping = JobVerdict(("n1",), settings, head_launcher=False)
    for at in range(0, 30):
        stepping.feed(NodeHeard("n1", float(at)))
        stepping.feed(RankOutput(float(at) * 0.1, stepping=True))
    assert stepping.hangs.threshold.to_json() == {"seconds": 10.0, "source": "floor"}
