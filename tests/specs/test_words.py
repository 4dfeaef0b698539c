"""The enums of orch's words: each member is its word, in text, in JSON and read back."""

from __future__ import annotations

import json

import pytest

from orchestrator.errors import UsageError
from orchestrator.specs.words import Fanout, StrEnum, fanout_named


class _Colour(StrEnum):
    RED = "red"
    DARK_BLUE = "dark-blue"


def test_a_member_is_its_word_wherever_it_goes() -> None:
    assert _Colour.DARK_BLUE == "dark-blue"
    assert str(_Colour.DARK_BLUE) == f"{_Colour.DARK_BLUE}" == "dark-blue"
    assert f"{_Colour.RED:>5}" == "  red"
    assert json.dumps({"c": _Colour.RED}) == '{"c": "red"}'
    assert _Colour(json.loads('"dark-blue"')) is _Colour.DARK_BLUE


def test_the_fan_outs_are_the_words_of_job_json_and_of_the_option() -> None:
    assert [str(f) for f in Fanout] == ["pdsh", "srun"]
    assert fanout_named("srun") is Fanout.SRUN


def test_an_unknown_fan_out_is_refused_naming_the_choices() -> None:
    with pytest.raises(UsageError, match="unknown fan-out 'ssh'") as info:
        fanout_named("ssh")
    assert info.value.hint == "choose one of: pdsh, srun"
