"""The benchmarks' pure helpers: summaries, ratios, alternation order, tables, budget."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import (
    Budget,
    Sample,
    alternation,
    ratio,
    ratio_text,
    render_table,
    run_alternating,
    summarize,
)


def test_summary_is_median_with_range_and_spread() -> None:
    summary = summarize([3.0, 1.0, 2.0, 10.0])
    assert summary.median == 2.5
    assert (summary.low, summary.high, summary.count) == (1.0, 10.0, 4)
    assert summary.spread == pytest.approx(9.0 / 2.5)
    assert summary.text() == "2.5 (1.0-10.0)"


def test_summary_of_one_value_and_of_none() -> None:
    assert summarize([4.25]).text(2) == "4.25"
    assert summarize([]).text() == "n/a"
    assert summarize([]).count == 0


def test_ratio_refuses_a_missing_or_zero_baseline() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(1.0, 0.0) is None
    assert ratio(1.0, float("nan")) is None
    assert ratio_text(ratio(1.1, 1.0)) == "1.10x"
    assert ratio_text(None) == "n/a"


def test_alternation_runs_every_method_once_per_rep_and_rotates_the_first() -> None:
    order = alternation(["a", "b", "c"], 3)
    assert order == [
        (0, "a"), (0, "b"), (0, "c"),
        (1, "b"), (1, "c"), (1, "a"),
        (2, "c"), (2, "a"), (2, "b"),
    ]  # fmt: skip
    assert alternation(["only"], 2) == [(0, "only"), (1, "only")]
    assert alternation([], 3) == []


def test_table_is_markdown_with_escaped_cells_and_checked_width() -> None:
    table = render_table(["nodes", "method"], [[2, "a|b"], [4, "line\nbreak"]])
    assert table.splitlines() == [
        "| nodes | method |",
        "|---|---|",
        "| 2 | a\\|b |",
        "| 4 | line break |",
    ]
    with pytest.raises(ValueError, match="2 columns"):
        render_table(["a", "b"], [[1]])


def test_budget_expires_on_its_clock() -> None:
    now = [100.0]
    budget = Budget(30.0, clock=lambda: now[0])
    assert budget.remaining() == 30.0 and not budget.expired()
    now[0] = 131.0
    assert budget.remaining() == 0.0 and budget.expired()


def test_run_alternating_runs_each_method_per_rep_until_the_budget_ends(capsys) -> None:
    now = [0.0]
    budget = Budget(25.0, clock=lambda: now[0])
    order: list[str] = []

    def run(method: str) -> Sample:
        order.append(method)
        now[0] += 10.0  # every run takes 10 s of the 25 s budget
        return Sample(wall=1.0, cpu=0.5, ok=True)

    samples = run_alternating(["a", "b"], 3, budget, run)
    assert order == ["a", "b", "b"]  # rep 2 starts with the other method, then the cap
    assert {m: len(s) for m, s in samples.items()} == {"a": 1, "b": 2}
    assert "time cap reached: stopping at rep 2" in capsys.readouterr().err
