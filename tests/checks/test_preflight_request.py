"""The pre-flight's request: what it leaves open is filled in from the head, once."""

from __future__ import annotations

from orchestrator.checks.environment import PushFix
from orchestrator.checks.request import PreflightRequest
from orchestrator.specs.constants import DEFAULT_MAIN_PORT
from orchestrator.specs.inventory import parse_hostfile

HOSTS = parse_hostfile("n1 slots=2\nn2 slots=2\n")
HEAD = {"python": "/head/bin/python", "cwd": "/home/u/job", "environ": {"NCCL_DEBUG": "INFO"}}


def test_what_the_request_leaves_open_is_the_heads() -> None:
    filled = PreflightRequest(HOSTS, python="", script="train.py").on_head(**HEAD)
    assert (filled.python, filled.workdir, filled.script) == (
        "/head/bin/python", "/home/u/job", "/home/u/job/train.py")  # fmt: skip
    assert (filled.main_address, filled.main_port) == ("n1", DEFAULT_MAIN_PORT)
    assert filled.env == {"NCCL_DEBUG": "INFO"}


def test_what_the_request_gives_is_kept() -> None:
    push = PushFix(command="orch env push", option=True)
    given = PreflightRequest(HOSTS, python="/opt/py", workdir="/w", script="/s/train.py",
                             main_port=29600, main_address="10.0.0.1", env={},
                             push=push)  # fmt: skip
    assert given.on_head(**HEAD) == given
    relative = PreflightRequest(HOSTS, python="/opt/py", workdir="/w", script="t.py")
    assert relative.on_head(**HEAD).script == "/w/t.py"  # the job runs in workdir on every node
