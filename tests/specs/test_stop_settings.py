"""The stop's settings as typed: the signal by any of its names, a positive grace, a
duration in seconds, minutes, hours or days; anything else a usage error that says why."""

from __future__ import annotations

import pytest

from orchestrator.errors import InputFileError, UsageError
from orchestrator.specs.recipe import parse_recipe
from orchestrator.specs.stop import (
    StopSettings,
    check_grace,
    duration_seconds,
    signal_named,
)


@pytest.mark.parametrize(
    ("word", "name"),
    [("SIGTERM", "SIGTERM"), ("term", "SIGTERM"), ("15", "SIGTERM"), ("sigusr1", "SIGUSR1"),
     ("INT", "SIGINT"), (" USR2 ", "SIGUSR2")],
)  # fmt: skip
def test_a_signal_by_any_of_its_names(word: str, name: str) -> None:
    assert signal_named(word) == name


@pytest.mark.parametrize(
    ("word", "why"),
    [("SIGFOO", "is not a signal"), ("", "is not a signal"), ("999", "is not a signal"),
     ("KILL", "a rank cannot handle it"), ("SIGSTOP", "a rank cannot handle it"),
     ("9", "a rank cannot handle it")],
)  # fmt: skip
def test_an_unknown_or_uncatchable_signal_is_a_usage_error(word: str, why: str) -> None:
    with pytest.raises(UsageError, match=why) as caught:
        signal_named(word)
    assert caught.value.hint and "SIGTERM" in caught.value.hint


@pytest.mark.parametrize("grace", [0, -1, -0.5, float("nan")])
def test_a_grace_must_be_more_than_zero(grace: float) -> None:
    with pytest.raises(UsageError, match="must be more than 0 s"):
        check_grace(grace)
    assert check_grace(0.5) == 0.5


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3600", 3600), ("90m", 5400), ("2h", 7200), ("1h30m", 5400), ("45s", 45), ("1d", 86400),
     ("1.5h", 5400), (" 10M ", 600), ("5400.0", 5400)],
)  # fmt: skip
def test_a_duration_in_any_unit(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "90x", "h", "1h30", "-5m", "0", "0m", "1 h", "2h-"])
def test_a_bad_duration_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="--time-limit"):
        duration_seconds(text)


def test_the_defaults_are_sigterm_and_two_minutes() -> None:
    assert StopSettings() == StopSettings("SIGTERM", 120.0)
    assert StopSettings().signum == 15


def test_a_recipe_names_its_stop_and_time_limit() -> None:
    recipe = parse_recipe("name: x\nscript: t.py\nstop_signal: usr1\nstop_grace: 300\n"
                          "time_limit: 2h\n")  # fmt: skip
    assert (recipe.stop_signal, recipe.stop_grace, recipe.time_limit) == ("SIGUSR1", 300, "2h")
    assert parse_recipe("name: x\nscript: t.py\ntime_limit: 3600\n").time_limit == "3600"


@pytest.mark.parametrize(
    ("line", "why"),
    [("stop_signal: SIGNOPE", "stop_signal 'SIGNOPE' is not a signal"),
     ("stop_grace: 0", "greater than 0"),
     ("time_limit: 2 hours", "time_limit '2 hours' is not a duration"),
     ("time_limit: 0", "needs some time")],
)  # fmt: skip
def test_a_recipes_bad_stop_names_its_line(line: str, why: str) -> None:
    with pytest.raises(InputFileError, match=why) as caught:
        parse_recipe(f"name: x\nscript: t.py\n{line}\n", source="r.yaml")
    assert caught.value.line == 3
