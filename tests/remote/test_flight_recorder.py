"""NCCL's flight recorder settings in the names the node's torch reads
(remote/flight_recorder.py)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from orchestrator.remote.flight_recorder import flight_recorder_env, parse_version, torch_version

STEM = "/tmp/orch-runs/j/n1/nccl_trace_rank_"


def test_torch_2_8_and_later_get_only_the_new_names():
    # The old names would make every rank print "... is deprecated; use TORCH_FR_...".
    assert flight_recorder_env("/tmp/orch-runs/j/n1", (2, 13)) == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": STEM,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    assert set(flight_recorder_env("/d", (2, 8))) == set(flight_recorder_env("/d", (3, 0)))


def test_older_torch_gets_the_names_it_reads():
    assert flight_recorder_env("/tmp/orch-runs/j/n1", (2, 7)) == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": STEM,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }


def test_an_unknown_torch_gets_both_names():
    env = flight_recorder_env("/d", None)
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from typing import Optional\n__version__ = '2.13.0+cpu'\ndebug = False\n", (2, 13)),
        ('__version__ = "2.7.1"\n', (2, 7)),
        ("git_version = 'abc'\n", None),
    ],
)
def test_torch_s_version_file_is_read_without_importing_torch(source, expected):
    assert parse_version(source) == expected


@pytest.mark.process
def test_the_installed_torch_is_found_without_importing_it():
    installed = importlib.metadata.version("torch")
    assert torch_version() == tuple(int(part) for part in installed.split(".")[:2])
    code = (
        "import sys\nfrom orchestrator.remote.flight_recorder import torch_version\n"
        "torch_version()\nassert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
