"""`orch env push`'s node program as it is shipped (envpush/push.py's PUSH_SOURCE): run by an
interpreter that has no orch, with only the parts loaded beside it, it looks and receives."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _envpush_stream import environment, head_stream
from _shipped import not_loaded_before

from orchestrator.envpush.push import PUSH_PARTS, PUSH_SOURCE
from orchestrator.remote import envpush, envpush_manifest, envpush_staging

# No site-packages, no PYTHONPATH, no current directory: orch is not importable.
BARE = [sys.executable, "-I", "-S"]


def _shipped(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*BARE, "-c", PUSH_SOURCE, *args], input=stdin, capture_output=True,
                          timeout=60, check=False)  # fmt: skip


def test_every_part_is_loaded_after_the_parts_it_imports() -> None:
    assert not_loaded_before(PUSH_PARTS, "envpush") == []


@pytest.mark.process
def test_the_shipped_program_looks_without_orch(tmp_path: Path) -> None:
    bare = subprocess.run([*BARE, "-c", "import orchestrator"], capture_output=True, check=False)
    assert bare.returncode != 0  # what follows runs on the shipped parts alone
    root = environment(tmp_path / "env", {"a.py": "a\n", "pkg/b.py": "b\n"})
    done = _shipped("look", json.dumps({"root": str(root), "marker": ".orch-push-marker-x"}))
    assert done.returncode == 0, done.stderr.decode()
    seen = json.loads(done.stdout)
    assert seen["exists"] is True and seen["shared"] is False and seen["running"] == []
    assert envpush_manifest.unpack(seen["manifest"]) == envpush_manifest.manifest(str(root))


@pytest.mark.process
def test_the_shipped_program_receives_the_stream_and_swaps_without_orch(tmp_path: Path) -> None:
    head = environment(tmp_path / "head", {"a.py": "a\n", "pkg/b.py": "b\n"})
    root = environment(tmp_path / "node" / "env", {"a.py": "a\n", "old.py": "old\n"})
    stream, sha = head_stream(head, ["pkg/b.py"])
    request = {"root": str(root), "manifest_sha256": sha, "listen": False, "force": False}
    route = {"source": "stdin", "forward": None}
    lines = f"{json.dumps(request)}\n{json.dumps(route)}\n".encode()
    done = _shipped("receive", stdin=lines + stream.getvalue())
    assert done.returncode == 0, done.stderr.decode()
    ready, answer = (json.loads(line) for line in done.stdout.splitlines())
    assert ready == {"ready": True, "port": None}
    assert answer["ok"] is True and answer["received"] == 1 and answer["relayed_bytes"] == 0
    assert (root / "pkg" / "b.py").read_text() == "b\n" and not (root / "old.py").exists()


# ----- the head going away near the end of a push ------------------------------------------
def _watched(staging, done: threading.Event) -> threading.Thread:
    """The stdin watcher of a node whose head's channel has just closed."""

    def watch() -> None:
        try:
            envpush._watch_stdin(io.BytesIO(b""), threading.Event(), threading.Event(), staging)
        finally:
            done.set()

    return threading.Thread(target=watch, daemon=True)


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """os._exit, recorded instead of ending the test's process."""
    called: list[int] = []

    def record(code: int) -> None:
        called.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", record)
    return called


def test_the_head_going_away_during_the_swap_never_costs_an_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exits: list[int]
) -> None:
    """The head's channel closes while the node swaps: the watcher, in its own thread, may
    only say so. Were it to remove the build there, it would reach into whichever tree the
    swap put where: here the removal is held until the swap is done."""
    head = environment(tmp_path / "head", {"a.py": "new\n", "pkg/b.py": "b\n", "c.py": "c\n"})
    root = environment(tmp_path / "node" / "env", {"a.py": "old\n", "c.py": "c\n"})
    stream, sha = head_stream(head, ["a.py", "pkg/b.py"])
    staging = envpush_staging.Staging(str(root))
    deleting, swapped, watcher_done = threading.Event(), threading.Event(), threading.Event()
    watcher = _watched(staging, watcher_done)
    real_unlink, real_exchange = os.unlink, envpush_staging.exchange

    def unlink(path, *args, **kwargs):  # the watcher's removal, once it has begun
        if threading.current_thread() is watcher and not deleting.is_set():
            deleting.set()
            swapped.wait(10)
        return real_unlink(path, *args, **kwargs)

    def exchange(path: str, where: str):
        watcher.start()  # the head's channel closes now
        while not (deleting.is_set() or watcher_done.is_set()):
            time.sleep(0.001)
        try:
            return real_exchange(path, where)
        finally:
            swapped.set()

    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(envpush_staging, "exchange", exchange)
    answer = envpush_staging.receive(str(root), sha, stream, staging)
    watcher.join(10)
    monkeypatch.undo()
    assert envpush_manifest.manifest(str(root)) == envpush_manifest.manifest(str(head))
    assert answer["ok"] is True  # the head's going away came after the last check
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == ["env"]
    assert exits == [] and staging.stopped.is_set()


def test_the_head_going_away_before_the_swap_keeps_the_old_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exits: list[int]
) -> None:
    head = environment(tmp_path / "head", {"a.py": "new\n"})
    root = environment(tmp_path / "node" / "env", {"a.py": "old\n"})
    stream, sha = head_stream(head, ["a.py"])
    staging = envpush_staging.Staging(str(root))
    done = threading.Event()
    real_record = envpush_manifest.record

    def built_then_gone(*args) -> None:  # the build is done; the head goes before the swap
        watcher = _watched(staging, done)
        watcher.start()
        watcher.join(10)
        assert done.is_set() and os.path.isdir(staging.path)  # the watcher removed nothing
        real_record(*args)

    monkeypatch.setattr(envpush_manifest, "record", built_then_gone)
    answer = envpush_staging.receive(str(root), sha, stream, staging)
    monkeypatch.undo()
    assert exits == []
    assert answer == {"ok": False, "error": "the head went away"}
    assert (root / "a.py").read_text() == "old\n"
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == ["env"]
