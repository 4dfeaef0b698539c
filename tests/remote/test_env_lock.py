"""The lock beside an environment (remote/env_lock.py) that keeps `orch env push`'s swap and
a job's start apart, on local directories and processes: the node side of the push, run as
it is shipped, looks again just before its swap and is refused while a job holds the lock or
runs from the environment; the agent holds the lock while the job it starts runs, and waits
for a swap in progress; a lock file another user could plant is never used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from _envpush_stream import environment, head_stream

from orchestrator.envpush.push import PUSH_SOURCE
from orchestrator.plan.agent_command import agent_argv
from orchestrator.remote import env_lock
from orchestrator.remote.agent_spec import AgentSpec, node_dir
from orchestrator.remote.logwire import decode_wire

BARE = [sys.executable, "-I", "-S"]  # the node side runs without orch, as on a node


def _push(head: Path, root: Path, rels: list[str], force: bool = False) -> dict:
    """The node side's receive of `rels` from `head` into `root`, its answer."""
    stream, sha = head_stream(head, rels)
    request = {"root": str(root), "manifest_sha256": sha, "listen": False, "force": force}
    route = {"source": "stdin", "forward": None}
    lines = f"{json.dumps(request)}\n{json.dumps(route)}\n".encode()
    done = subprocess.run([*BARE, "-c", PUSH_SOURCE, "receive"], input=lines + stream.getvalue(),
                          capture_output=True, timeout=60, check=False)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture
def envs(tmp_path: Path) -> tuple[Path, Path]:
    """The head's environment, and a node's older one at its own path (real, no link)."""
    base = tmp_path.resolve()
    head = environment(base / "head", {"a.py": "new\n"})
    root = environment(base / "node" / "env", {"a.py": "old\n"})
    return head, root


@pytest.mark.process
def test_a_swap_is_refused_while_a_job_holds_the_environment(envs) -> None:
    """A job that started after the push looked (its agent holds the lock shared): the
    push keeps the environment it had, and says why and the fix."""
    head, root = envs
    made = env_lock.take_exclusive(str(root))  # as a push before this one left it
    assert made is not None
    os.close(made)
    job = env_lock.hold_shared(str(root))
    assert job is not None
    try:
        answer = _push(head, root, ["a.py"])
    finally:
        os.close(job)
    assert answer["ok"] is False and answer["refused"] is True, answer
    assert answer["error"].startswith(f"an orch job (holding {root}.orch-lock) started from "
                                      f"{root} since the push looked")  # fmt: skip
    assert "push with --force" in answer["fix"]
    assert (root / "a.py").read_text() == "old\n"
    assert sorted(p.name for p in root.parent.iterdir()) == ["env", "env.orch-lock"]
    assert _push(head, root, ["a.py"])["ok"] is True  # the job ended: the push goes through
    assert (root / "a.py").read_text() == "new\n"


@pytest.mark.process
def test_a_process_started_from_the_environment_since_the_look_refuses_the_swap(envs) -> None:
    head, root = envs
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(sys.executable)
    job = subprocess.Popen([str(root / "bin" / "python"), "-c", "import time; time.sleep(60)"])
    try:
        answer = _push(head, root, ["a.py"])
        assert answer["ok"] is False and answer["refused"] is True, answer
        assert answer["running"] == [[job.pid, None]]
        assert f"processes (pids {job.pid}) started from {root}" in answer["error"]
        assert (root / "a.py").read_text() == "old\n"
        forced = _push(head, root, ["a.py"], force=True)  # --force: swapped under it
        assert forced["ok"] is True and (root / "a.py").read_text() == "new\n"
    finally:
        job.kill()
        job.wait()


@pytest.mark.process
def test_a_lock_file_not_the_users_own_is_never_used(envs) -> None:
    """Another user who can write beside the environment plants its lock's name: a push
    refuses to swap (naming it and the fix), a job's start does not wait on it."""
    head, root = envs
    elsewhere = root.parent / "theirs"
    elsewhere.write_text("")
    Path(env_lock.lock_path(str(root))).symlink_to(elsewhere)
    answer = _push(head, root, ["a.py"])
    assert answer["ok"] is False and answer["refused"] is True
    assert answer["error"].startswith(f"{root}.orch-lock cannot be the environment's lock file")
    assert answer["fix"] == f"remove {root}.orch-lock (it is not orch's) and push again"
    assert (root / "a.py").read_text() == "old\n"
    started = time.monotonic()
    assert env_lock.hold_shared(str(root), wait_s=5.0) is None
    assert time.monotonic() - started < 1.0


def _waiting_for_the_lock(out: Path) -> bool:
    records = [decode_wire(line) for line in out.read_bytes().splitlines()]
    beats = [r for r in records if r is not None and r.kind == "control" and r.text == "heartbeat"]
    return any(r.fields.get("waiting") == "the environment's lock" for r in beats)


def _until(what, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.process
def test_the_agent_waits_for_a_swap_and_holds_the_environment_while_its_job_runs(tmp_path):
    """A push swapping (the lock held exclusively) when a job starts: the agent waits, then
    starts the job in the environment swapped in; while the job runs a push cannot take
    the lock (its swap is refused); once the job ended, it can."""
    env = tmp_path.resolve() / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True,
                   timeout=120)  # fmt: skip
    swapping = env_lock.take_exclusive(str(env))
    assert swapping is not None
    started, stop, out = tmp_path / "started", tmp_path / "stop", tmp_path / "agent.out"
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    command = f"touch {started}; while [ ! -e {stop} ]; do sleep 0.05; done"
    spec = AgentSpec(job_id, workdir=str(tmp_path), command=("sh", "-c", command))
    argv = [*agent_argv(str(env / "bin" / "python"), spec)[:-2], "n1", "0"]
    with out.open("wb") as sink:
        agent = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink)
    try:
        _until(lambda: started.exists() or _waiting_for_the_lock(out))
        assert not started.exists()  # not while the push swaps: it waits
        os.close(swapping)
        _until(started.exists)
        assert env_lock.take_exclusive(str(env)) is None  # the job holds it: no swap
        stop.touch()
        assert agent.wait(30) == 0
        after = env_lock.take_exclusive(str(env))
        assert after is not None  # the job ended: a push may swap
        os.close(after)
    finally:
        stop.touch()
        if agent.poll() is None:
            agent.kill()
        agent.wait()
        shutil.rmtree(Path(node_dir(job_id, "n1", os.getuid())).parent, ignore_errors=True)
