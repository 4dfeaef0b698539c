"""The checkpoints' settings as typed: a directory the same on every node (a relative one in
the workdir, never ~), at least one copy, a rate with units; a recipe's keys checked at their
line, with their spelling when misspelled."""

from __future__ import annotations

import pytest

from orchestrator.errors import InputFileError, UsageError
from orchestrator.specs.checkpoints import (
    DEFAULT_BANDWIDTH,
    CheckpointSettings,
    bandwidth_bytes,
    check_copies,
    check_dir,
    rate_text,
    resolved_dir,
)
from orchestrator.specs.recipe import parse_recipe


@pytest.mark.parametrize(
    ("given", "rate"),
    [("200M", 200_000_000), ("1G", 10**9), ("500k", 500_000), ("500K", 500_000),
     ("1.5G", 1_500_000_000), ("64Mi", 64 * 2**20), ("100MB/s", 10**8), ("2 GB", 2 * 10**9),
     ("4096", 4096), (4096, 4096), ("0", 0), ("off", 0), ("OFF", 0), (0, 0)],
)  # fmt: skip
def test_a_rate_in_bytes_per_second_with_its_units(given: str | int, rate: int) -> None:
    assert bandwidth_bytes(given) == rate


@pytest.mark.parametrize("given", ["fast", "-5M", "1X", "M", "", "1.5.5G", "0.0001"])
def test_anything_else_is_no_rate(given: str) -> None:
    with pytest.raises(UsageError, match=r"--checkpoint-bandwidth") as refused:
        bandwidth_bytes(given)
    assert refused.value.hint and "--checkpoint-bandwidth 200M" in refused.value.hint


def test_the_default_rate_is_200_megabytes_a_second() -> None:
    assert bandwidth_bytes("200M") == DEFAULT_BANDWIDTH
    assert CheckpointSettings("/data/ckpt").words == (
        "/data/ckpt, 1 copy on another node, at most 200 MB/s"
    )
    assert CheckpointSettings("/c", copies=2, bandwidth=0).words == (
        "/c, 2 copies on other nodes, no bandwidth cap"
    )
    assert [rate_text(n) for n in (1_500_000_000, 500_000, 800)] == ["1.5 GB/s", "500 kB/s",
                                                                    "800 B/s"]  # fmt: skip


def test_a_relative_directory_is_taken_in_the_workdir() -> None:
    assert resolved_dir("ckpt", "/work/x") == "/work/x/ckpt"
    assert resolved_dir("./out/../ckpt/", "/work/x") == "/work/x/ckpt"
    assert resolved_dir("/data/ckpt", "/work/x") == "/data/ckpt"


def test_a_relative_directory_in_a_relative_workdir_is_refused() -> None:
    with pytest.raises(UsageError, match="the nodes need one absolute path"):
        resolved_dir("ckpt", "work")


@pytest.mark.parametrize("given", ["~/ckpt", "~", "~user/ckpt"])
def test_a_home_is_refused_with_the_fix(given: str) -> None:
    with pytest.raises(UsageError, match="may differ between nodes: give an absolute path"):
        check_dir(given)


@pytest.mark.parametrize(("given", "said"), [("", "is empty"),
                                             ("/", "need a directory of their own"),
                                             ("//", "need a directory of their own")])  # fmt: skip
def test_no_directory_or_the_root_is_refused(given: str, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        check_dir(given)


@pytest.mark.parametrize("copies", [0, -1])
def test_at_least_one_copy(copies: int) -> None:
    with pytest.raises(UsageError, match=f"--checkpoint-copies {copies}: each checkpoint is "
                       "copied to at least 1 other node"):  # fmt: skip
        check_copies(copies)
    assert check_copies(3) == 3


def test_settings_read_back_as_written_and_refuse_anything_else() -> None:
    settings = CheckpointSettings("/data/ckpt", copies=2, bandwidth=0)
    assert CheckpointSettings.from_dict(settings.to_dict()) == settings
    with pytest.raises(ValueError, match="want dir, copies, bandwidth"):
        CheckpointSettings.from_dict({"dir": "/c", "copies": "2", "bandwidth": 0})


def _recipe(keys: str, environ: dict[str, str] | None = None):
    return parse_recipe(f"name: r\nscript: train.py\n{keys}", source="r.yaml", environ=environ)


def test_a_recipes_keys_are_read_with_their_units_and_variables() -> None:
    recipe = _recipe("checkpoint_dir: ${SCRATCH}/ckpt\ncheckpoint_copies: 2\n"
                     "checkpoint_bandwidth: 1G\n", {"SCRATCH": "/scratch"})  # fmt: skip
    assert (recipe.checkpoint_dir, recipe.checkpoint_copies, recipe.checkpoint_bandwidth) == (
        "/scratch/ckpt", 2, 10**9)
    assert _recipe("checkpoint_dir: c\ncheckpoint_bandwidth: off\n").checkpoint_bandwidth == 0
    assert _recipe("").checkpoint_dir is None


@pytest.mark.parametrize(
    ("keys", "said"),
    [("checkpoint_dir: ~/ckpt\n", "r.yaml:3: checkpoint_dir: checkpoint_dir '~/ckpt': ~ is "
      "each node's own home"),
     ("checkpoint_dir: /c\ncheckpoint_copies: 0\n", "r.yaml:4: checkpoint_copies: "),
     ("checkpoint_dir: /c\ncheckpoint_bandwidth: fast\n", "r.yaml:4: checkpoint_bandwidth: "
      "checkpoint_bandwidth 'fast' is not a rate"),
     ("checkpoint_copies: 2\n", "r.yaml:3: checkpoint_copies: checkpoint_copies goes with "
      "checkpoint_dir: add checkpoint_dir: PATH"),
     ("checkpoint_bandwidth: 1G\n", "r.yaml:3: checkpoint_bandwidth: checkpoint_bandwidth goes "
      "with checkpoint_dir"),
     ("env: {ORCH_CHECKPOINT_DIR: /c}\n", "env: ORCH_CHECKPOINT_DIR is set by orch")],
)  # fmt: skip
def test_a_recipes_bad_key_is_refused_at_its_line(keys: str, said: str) -> None:
    with pytest.raises(InputFileError) as refused:
        _recipe(keys)
    assert said in str(refused.value)


def test_a_misspelled_checkpoint_key_gets_its_spelling() -> None:
    with pytest.raises(InputFileError) as refused:
        _recipe("checkpoint_copy: 2\n")
    assert str(refused.value) == "r.yaml:3: unknown key 'checkpoint_copy'"
    assert refused.value.hint and refused.value.hint.startswith(
        "did you mean 'checkpoint_copies'?")
