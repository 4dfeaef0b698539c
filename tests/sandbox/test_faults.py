"""The sandbox's injected faults, on values: a node's small filesystem of its own."""

from __future__ import annotations

import os

import pytest

from orchestrator.errors import SandboxError
from orchestrator.sandbox.faults import tmpfs_options


def _stat(mode: int, uid: int, gid: int) -> os.stat_result:
    return os.stat_result((0o040000 | mode, 0, 0, 2, uid, gid, 4096, 0, 0, 0))


def test_a_small_filesystem_has_the_size_mode_and_owner_of_the_directory_it_covers() -> None:
    assert tmpfs_options(1 << 20, _stat(0o750, 1001, 1002)) == (
        "size=1048576,mode=750,uid=1001,gid=1002"
    )
    assert tmpfs_options(4096, _stat(0o1777, 0, 0)) == "size=4096,mode=1777,uid=0,gid=0"


@pytest.mark.parametrize("size", [0, -1])
def test_a_filesystem_that_holds_nothing_is_refused(size: int) -> None:
    with pytest.raises(SandboxError, match="cannot hold anything"):
        tmpfs_options(size, _stat(0o755, 0, 0))
