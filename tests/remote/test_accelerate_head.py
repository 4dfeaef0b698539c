"""The head launcher's adjustments to what accelerate hands DeepSpeed's runner, on values."""

from __future__ import annotations

import logging

from orchestrator.remote.accelerate_head import (
    _NothingOfTheHeadsEnvironment,
    no_env_file_lines,
    without_runners_path_entry,
)


def test_the_working_directory_is_left_to_deepspeeds_runner() -> None:
    # accelerate appended /work to what the user had; the runner will put /work first.
    assert without_runners_path_entry({"PYTHONPATH": "/lib:/work"}, "/work") == {
        "PYTHONPATH": "/lib"
    }
    # Nothing of the user's: no PYTHONPATH at all, so the runner sets it to /work alone.
    assert without_runners_path_entry({"PYTHONPATH": "/work", "A": "1"}, "/work") == {"A": "1"}
    # The user's own entries stay, even one equal to the working directory earlier on.
    assert without_runners_path_entry({"PYTHONPATH": "/work:/lib"}, "/work") == {
        "PYTHONPATH": "/work:/lib"
    }


def test_no_warning_naming_a_variable_of_the_head_is_let_through() -> None:
    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("accelerate.utils.environment", logging.WARNING, "", 0,
                                 message, (), None)  # fmt: skip

    keep = _NothingOfTheHeadsEnvironment()
    ours = "WARNING: Skipping PDSH_SSH_ARGS_APPEND=-o BatchMode=yes as it contains forbidden"
    assert not keep.filter(record(ours))
    # The user's own, and the ones every SSH login has: their values are not to be printed.
    assert not keep.filter(record("WARNING: Skipping MY_VAR=a b as it contains forbidden"))
    assert not keep.filter(record("WARNING: Skipping SSH_CONNECTION=10.0.0.1 4 10.0.0.2 22 as"))
    assert keep.filter(record("Using RTX 4000 series which doesn't support faster communication"))


def test_deepspeeds_env_file_gets_no_line_of_the_heads_environment() -> None:
    assert no_env_file_lines({"MY_VAR": "a b", "PATH": "/usr/bin"}) == []
