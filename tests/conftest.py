"""Shared fixtures: a real loopback SSH cluster for integration tests.

Each test session gets its own sandbox (own state directory, subnet and node
name prefix), so it never touches a sandbox the user has up, and parallel
sessions on one machine do not collide.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from orchestrator.remote.agent_spec import RUNS_ROOT
from orchestrator.sandbox import Sandbox, SandboxState

# Property tests check values, not speed: on a shared 2-core machine a slow example is no
# failure (hypothesis's default 200 ms deadline made them flaky under load).
settings.register_profile("orch", deadline=None)
settings.load_profile("orch")


def _sandbox_prereqs_missing() -> str | None:
    for tool in ("sshd", "ssh", "pdsh", "ssh-keygen"):
        if not shutil.which(tool) and not os.access(f"/usr/sbin/{tool}", os.X_OK):
            return tool
    return None


@pytest.fixture(scope="session")
def sandbox_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Start sandboxes with unique names; every one is taken down at session end."""
    missing = _sandbox_prereqs_missing()
    if missing:
        # scripts/test.sh installs these; a bare `pytest` without them is a setup error.
        pytest.fail(f"`{missing}` is not installed: run `bash scripts/test.sh`", pytrace=False)
    started: list[Sandbox] = []
    node_names: list[str] = []

    def start(nodes: int = 4, slots: int = 2, sshd_profile: str = "default", slurm: bool = False):
        tag = uuid.uuid4().hex[:6]
        box = Sandbox(tmp_path_factory.mktemp(f"sandbox-{tag}", numbered=False))
        started.append(box)
        state = box.up(nodes=nodes, slots=slots, prefix=f"t{tag}n", sshd_profile=sshd_profile,
                       slurm=slurm)  # fmt: skip
        node_names.extend(node.name for node in state.nodes)
        return box, state

    yield start
    for box in started:
        box.down()
    _remove_node_local_logs(node_names)


def _remove_node_local_logs(node_names: list[str]) -> None:
    """Node-local raw logs that tests kept on purpose (or could not pull back): the
    sandbox's nodes write them to this machine's /tmp. Only this session's nodes."""
    root = Path(RUNS_ROOT)
    if not root.is_dir():
        return
    for job in root.iterdir():
        for name in node_names:
            shutil.rmtree(job / name, ignore_errors=True)
        with contextlib.suppress(OSError):
            job.rmdir()  # only when nothing else is left in it


@pytest.fixture(scope="session")
def sandbox(sandbox_factory) -> tuple[Sandbox, SandboxState]:
    """One 4-node, 2-slot sandbox shared by the tests that only read from it."""
    return sandbox_factory(4, 2)


@pytest.fixture
def hostfile(sandbox) -> Path:
    return Path(sandbox[1].hostfile)
