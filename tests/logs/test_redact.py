"""Secrets masked out of logs (logs/redact.py): the head's lines and the raw files pulled
back, on values and real temporary files."""

from __future__ import annotations

import io
import stat
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.logs.redact import Redactor, mask, redact_file, redact_stream, secret_values
from orchestrator.plan.build import build_plan
from orchestrator.plan.launch_plan import HeadContext, Placement
from orchestrator.plan.request import LaunchSpec
from orchestrator.specs.inventory import make_hostfile

SECRETS = ("hunter22", "hf_abcdef", "abc")  # the last is too short to mask


def _whole(data: bytes) -> bytes:
    return mask(data, [b"hf_abcdef", b"hunter22"])


@given(
    st.lists(st.sampled_from([b"hunter22", b"hf_abcdef", b"x", b"\n", b"\r", b"abc", b"hunt"]),
             max_size=60),
    st.integers(min_value=1, max_value=20),
)  # fmt: skip
def test_a_stream_is_masked_as_a_whole_would_be_whatever_its_blocks(parts, block) -> None:
    data = b"".join(parts)
    target = io.BytesIO()
    redact_stream(io.BytesIO(data), target, SECRETS, block=block)
    assert target.getvalue() == _whole(data)


def test_a_file_is_masked_in_place_keeping_its_mode(tmp_path: Path) -> None:
    log = tmp_path / "rank0.stdout.raw"
    log.write_bytes(b"token hf_abcdef\rstep 1\rpassword hunter22" + b"." * 3_000_000)
    log.chmod(0o640)
    redact_file(log, SECRETS)
    assert log.read_bytes().startswith(b"token ***\rstep 1\rpassword ***...")
    assert log.stat().st_size == 3_000_000 + len(b"token ***\rstep 1\rpassword ***")
    assert stat.S_IMODE(log.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == [log.name]  # no temporary left


def test_nothing_to_mask_leaves_the_file_as_it_is(tmp_path: Path) -> None:
    log = tmp_path / "stdout.raw"
    log.write_bytes(b"abc\n")
    before = log.stat()
    redact_file(log, ("abc", ""))  # too short to mask
    assert log.stat().st_ino == before.st_ino and log.read_bytes() == b"abc\n"


def test_the_line_redactor_masks_across_chunks() -> None:
    redactor = Redactor(SECRETS)
    assert redactor.lines(b"n1: key hun") == []
    assert redactor.lines(b"ter22 ok\nn1: abc") == [b"n1: key *** ok"]
    assert redactor.rest() == [b"n1: abc"]


def test_the_secret_values_are_the_heads_by_name_and_the_jobs_secret_ones() -> None:
    place = Placement(job_id="j", hostfile=make_hostfile(["n1"], 1), run_dir="/r", main_port=29500)
    head = HeadContext("pdsh", "/tmp/orch-j", sys.executable,
                       environ={"AWS_SECRET_ACCESS_KEY": "aws-secret", "DB_URL": "pg://u:p@h",
                                "HOME": "/root"})  # fmt: skip
    spec = LaunchSpec(script="t.py", launcher="torchrun", env=(("HF_TOKEN", "hf_x1"),
                      ("MODE", "train")), passthrough=("DB_URL",))  # fmt: skip
    plan = build_plan(spec, place, head)
    assert set(secret_values(plan, head.environ)) == {"aws-secret", "hf_x1", "pg://u:p@h"}
