"""The agent's node directory (remote/agent.py): checked before anything is written, and the
ranks' program never written through a link another user planted in it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from orchestrator.remote import agent, node_files, owned
from orchestrator.remote.agent_spec import AgentSpec

ME = os.getuid()


def _supervisor(tmp_path: Path, monkeypatch) -> agent.Supervisor:
    monkeypatch.setattr(owned, "NODE_BASE", str(tmp_path))  # the user's is orch-<uid> in it
    private = json.dumps({"env": {}, "rank_argv": ["python3", "train.py"]}).encode()
    node_files.write("job-1", "n1", private, ME)
    spec = AgentSpec("job-1", private_sha256=hashlib.sha256(private).hexdigest())
    return agent.Supervisor(spec, "n1", "0")


def test_a_link_planted_for_the_ranks_program_is_refused(tmp_path: Path, monkeypatch) -> None:
    supervisor = _supervisor(tmp_path, monkeypatch)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (supervisor.dir / "bin").symlink_to(theirs)
    problem = supervisor._prepare()
    assert problem is not None and "n1 is not safe to use" in problem
    assert "symbolic link" in problem and str(supervisor.dir / "bin") in problem
    assert list(theirs.iterdir()) == []  # orch-rank and orch_rank.py not written there


def test_the_ranks_program_is_the_users_alone(tmp_path: Path, monkeypatch) -> None:
    supervisor = _supervisor(tmp_path, monkeypatch)
    assert supervisor._prepare() is None
    try:
        made = [p for p in supervisor.dir.rglob("*") if not p.is_socket()]
        assert made and all(p.stat().st_mode & 0o077 == 0 for p in made)
        assert (supervisor.dir / "bin" / agent.RANK_PROGRAM).stat().st_mode & 0o700 == 0o700
    finally:
        if supervisor.rank_channels is not None:
            supervisor.rank_channels.close(1.0)
