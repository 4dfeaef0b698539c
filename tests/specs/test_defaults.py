"""Defaults for what a user types every time (specs/defaults.py), on values: each file's keys
with their file and line, errors that name the file, the line and the fix, and the order in
which the environment, the project's file and the user's file give way to one another."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.specs.defaults import (
    Defaults,
    Setting,
    environment_defaults,
    merged,
    parse_defaults,
    user_file,
)

PROJECT = Path("/work/proj/orch.toml")


def test_a_files_keys_are_read_with_their_line_and_a_hostfile_from_the_files_place():
    text = ('# my cluster\nhostfile = "hosts/gpu"\nlauncher = "deepspeed"\n'
            'python = "~/v/bin/python"\n')
    got = parse_defaults(text, PROJECT)
    assert got["hostfile"] == Setting("/work/proj/hosts/gpu", "/work/proj/orch.toml:2")
    assert got["launcher"] == Setting("pdsh", "/work/proj/orch.toml:3")  # the tool's name
    assert got["python"].value == str(Path("~/v/bin/python").expanduser())
    assert parse_defaults('hostfile = "/etc/hf"\n', PROJECT)["hostfile"].value == "/etc/hf"
    assert parse_defaults("", PROJECT) == {}


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [('\nhostfle = "hf"\n', "orch.toml:2: unknown key 'hostfle'", "did you mean 'hostfile'?"),
     ('colour = "red"\n', "orch.toml:1: unknown key 'colour'", "the keys: hostfile, launcher"),
     ('launcher = "mpi"\n', "orch.toml:1: unknown launcher 'mpi'", "pdsh, standard, torchrun"),
     ("python = 3\n", "orch.toml:1: 'python' is 3, not a string", 'python = "..."'),
     ('hostfile = ""\n', "orch.toml:1: 'hostfile' is ''", 'hostfile = "..."'),
     ("[launch]\nhostfile = 'hf'\n", "orch.toml:1: unknown key 'launch'", "the keys"),
     ("launcher = \n", "orch.toml:1: not TOML", 'key = "value"')],
)  # fmt: skip
def test_a_bad_file_names_itself_the_line_and_the_fix(text: str, message: str, hint: str):
    with pytest.raises(UsageError) as raised:
        parse_defaults(text, PROJECT)
    assert raised.value.message.startswith("/work/proj/") and message in raised.value.message
    assert hint in (raised.value.hint or "")


def test_the_user_file_is_under_xdg_config_home_else_dot_config():
    home = Path("/home/u")
    assert user_file({}, home) == Path("/home/u/.config/orch/config.toml")
    assert user_file({"XDG_CONFIG_HOME": "/cfg"}, home) == Path("/cfg/orch/config.toml")
    # A relative XDG_CONFIG_HOME is to be ignored, as the XDG spec says.
    assert user_file({"XDG_CONFIG_HOME": "cfg"}, home) == Path("/home/u/.config/orch/config.toml")


def test_orch_hostfile_is_taken_from_the_working_directory():
    assert environment_defaults({}, Path("/w")) == {}
    got = environment_defaults({"ORCH_HOSTFILE": "hf"}, Path("/w"))
    assert got == {"hostfile": Setting("/w/hf", "ORCH_HOSTFILE")}


def test_the_environment_beats_the_project_which_beats_the_user():
    env = {"hostfile": Setting("/e", "ORCH_HOSTFILE")}
    project = {"hostfile": Setting("/p", "p:1"), "launcher": Setting("torchrun", "p:2")}
    user = {"hostfile": Setting("/u", "u:1"), "launcher": Setting("pdsh", "u:1"),
            "python": Setting("/py", "u:3")}  # fmt: skip
    assert merged([env, project, user]) == Defaults(
        hostfile=Setting("/e", "ORCH_HOSTFILE"), launcher=Setting("torchrun", "p:2"),
        python=Setting("/py", "u:3"),
    )  # fmt: skip
    assert merged([{}, {}, {}]) == Defaults()
