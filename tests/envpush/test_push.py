"""`orch env push` on values and on local directories: the delta, the refusals, and the
node side's build-and-swap (a wrong hash leaves the old environment as it was)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from orchestrator.envpush.push import EnvSource, delta, environment_source, refusal
from orchestrator.envpush.relay import Stream, write_stream
from orchestrator.errors import UsageError
from orchestrator.probe.facts import Environment
from orchestrator.remote import envpush as node_side

HEAD = Environment("f" * 16, "cpython", "3.11.7", "cpython-311-x86_64-linux-gnu", "debian 12",
                   "glibc 2.36", "x86_64", {})  # fmt: skip
SOURCE = EnvSource("/opt/envs/train", "venv", "/opt/envs/train/bin/python", "/usr/bin/python3.11")
SEEN = {"interpreter": {"version": "3.11.7", "abi": "cpython-311-x86_64-linux-gnu"},
        "platform": {"libc": "glibc 2.36", "machine": "x86_64"}, "free_bytes": 10 << 30,
        "running": []}  # fmt: skip


def test_delta_sends_what_differs_and_removes_what_the_head_has_not() -> None:
    head = {"bin": ["d", 0, "", 0o755], "bin/python": ["l", 0, "python3.11", 0],
            "a.py": ["f", 10, "aa", 0o644], "b.py": ["f", 20, "bb", 0o644]}  # fmt: skip
    node = {"bin/python": ["l", 0, "python3.11", 0], "a.py": ["f", 10, "aa", 0o644],
            "b.py": ["f", 20, "old", 0o644], "stale.py": ["f", 5, "ss", 0o644]}  # fmt: skip
    change = delta(head, node)
    assert dict(change.send) == {"b.py": ["f", 20, "bb", 0o644]}
    assert change.remove == ("stale.py",) and dict(change.dirs) == {"bin": 0o755}
    assert change.send_bytes == 20
    assert delta(head, head).send == {} and delta(head, head).remove == ()


@pytest.mark.parametrize(
    ("seen", "needs", "text"),
    [
        ({**SEEN, "interpreter": {"version": "3.11.2"}}, 0, "is Python 3.11.2, the head's"),
        ({**SEEN, "platform": {"libc": "musl 1.2", "machine": "x86_64"}}, 0, "binary wheels"),
        ({**SEEN, "running": [[4242, None]]}, 0, "processes (pids 4242) run from /opt/envs/train"),
        ({**SEEN, "running": [[4242, "j-20261125-1"], [4243, "j-20261125-1"]]}, 0,
         "orch job j-20261125-1 (pids 4242, 4243) run from"),
        ({**SEEN, "mount_point": True, "real_root": "/opt/envs/train"}, 0,
         "/opt/envs/train is a mount point"),
        (SEEN, 11 << 30, "11264 MiB to receive, 10240 MiB free"),
    ],
)
def test_a_node_that_cannot_take_the_environment_is_refused(seen, needs, text) -> None:
    found = refusal("n2", SOURCE, HEAD, seen, needs, force=False)
    assert found is not None and text in found[0] and found[0].startswith("n2: ")
    assert refusal("n2", SOURCE, HEAD, SEEN, 0, force=False) is None


def test_only_an_environment_is_pushed(tmp_path: Path) -> None:
    venv = tmp_path / "train"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    source = environment_source(str(venv / "bin" / "python"))
    assert source.kind == "venv" and source.root == str(venv)
    assert source.runner == "/usr/bin/" + Path("/usr/bin/python3").resolve().name
    with pytest.raises(UsageError, match="not in a virtual or conda environment"):
        environment_source("/usr/bin/python3")


def _stream(head_root: Path, rels: list[str]) -> tuple[io.BytesIO, str]:
    """The head's stream of `rels` out of `head_root`, and its manifest's sha256."""
    found = node_side.manifest(str(head_root))
    stream = Stream(str(head_root), found, tuple(rels))
    data, out = stream.manifest_bytes(), io.BytesIO()
    write_stream(stream, data, out)
    out.seek(0)
    return out, hashlib.sha256(data).hexdigest()


def _environment(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.process
def test_the_node_builds_beside_and_swaps_or_keeps_the_old(tmp_path: Path) -> None:
    head = _environment(tmp_path / "head", {"kept.py": "kept\n", "pkg/new.py": "new\n"})
    nodes = tmp_path / "node"
    root = _environment(nodes / "env", {"kept.py": "kept\n", "old.py": "old\n"})
    stream, sha = _stream(head, ["pkg/new.py"])
    answer = node_side.receive(str(root), "0" * 64, stream)  # not the head's manifest
    assert answer["ok"] is False and "does not match its sha256" in answer["error"]
    assert sorted(p.name for p in nodes.iterdir()) == ["env"]  # nothing half-written
    assert (root / "old.py").exists()

    good, sha = _stream(head, ["pkg/new.py"])
    bad = io.BytesIO(good.getvalue().replace(b"new\n", b"bad\n"))
    answer = node_side.receive(str(root), sha, bad)
    assert answer["ok"] is False and "sha256 does not match" in answer["error"]
    assert sorted(p.name for p in nodes.iterdir()) == ["env"]

    answer = node_side.receive(str(root), sha, good)
    assert answer["ok"] is True and answer["received"] == 1 and answer["received_bytes"] == 4
    assert sorted(p.name for p in nodes.iterdir()) == ["env"]
    assert (root / "pkg" / "new.py").read_text() == "new\n" and not (root / "old.py").exists()
    assert (root / "kept.py").read_text() == "kept\n"
    # the next look reads the recorded hashes instead of the files
    recorded = json.loads((root / node_side.MANIFEST_NAME).read_text())
    assert set(recorded) == {"kept.py", "pkg/new.py"}
    again = node_side.manifest(str(root), recorded)
    assert again["pkg/new.py"][2] == hashlib.sha256(b"new\n").hexdigest()


@pytest.mark.process
def test_a_node_keeps_its_own_files_and_passes_every_byte_on(tmp_path: Path) -> None:
    """Two nodes that need different files get one stream: the first keeps what it lacks,
    skips the rest, and passes the whole stream on, byte for byte."""
    head = _environment(tmp_path / "head", {"a.py": "a\n", "b.py": "b\n"})
    first = _environment(tmp_path / "n1" / "env", {"a.py": "a\n"})  # lacks b.py
    stream, sha = _stream(head, ["a.py", "b.py"])  # the second node lacks both
    left, right = socket.socketpair()
    relay = node_side.Relay(stream.read, left)
    passed = io.BytesIO()
    reader = threading.Thread(target=lambda: passed.write(_read_all(right)))
    reader.start()
    answer = node_side.receive(str(first), sha, relay)
    relay.drain()
    relay.drop()
    reader.join(10)
    assert answer["ok"] is True and answer["received"] == 1  # b.py only
    assert (first / "b.py").read_text() == "b\n"
    assert passed.getvalue() == stream.getvalue() and relay.forward_error is None
    second = tmp_path / "n2" / "env"
    passed.seek(0)
    assert node_side.receive(str(second), sha, passed)["received"] == 2
    assert sorted(p.name for p in second.iterdir()) == [".orch-manifest.json", "a.py", "b.py"]


@pytest.mark.process
def test_a_lost_next_node_stops_the_passing_on_not_the_build(tmp_path: Path) -> None:
    head = _environment(tmp_path / "head", {"a.py": "a\n" * 400_000})
    stream, sha = _stream(head, ["a.py"])
    left, right = socket.socketpair()
    right.close()  # the next node is gone
    relay = node_side.Relay(stream.read, left)
    answer = node_side.receive(str(tmp_path / "env"), sha, relay)
    assert answer["ok"] is True and relay.forward_error is not None
    assert "passing the stream on failed" in relay.forward_error


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_second_push_of_the_same_root_waits_its_turn(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(node_side.owned, "user_directory", lambda uid: str(tmp_path / "u"))
    held = node_side.take_lock(str(tmp_path / "env"))
    assert held is not None
    assert node_side.take_lock(str(tmp_path / "env")) is None  # another push runs
    assert node_side.take_lock(str(tmp_path / "other")) is not None
    os.close(held)
    assert node_side.take_lock(str(tmp_path / "env")) is not None


def test_the_heads_manifest_reads_only_files_changed_since_the_last_push(tmp_path, monkeypatch):
    from orchestrator.envpush import push as envpush

    monkeypatch.setattr(envpush.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = tmp_path / "env"
    root.mkdir()
    weights = root / "weights.bin"
    weights.write_bytes(b"a" * 100)
    first = envpush.head_manifest(str(root))["weights.bin"][2]
    stamp = weights.stat().st_mtime_ns
    weights.write_bytes(b"b" * 100)  # same size, and the mtime put back: taken as unchanged
    os.utime(weights, ns=(stamp, stamp))
    assert envpush.head_manifest(str(root))["weights.bin"][2] == first
    weights.write_bytes(b"b" * 101)
    assert envpush.head_manifest(str(root))["weights.bin"][2] != first



def test_an_environment_made_at_another_path_is_refused_naming_it(tmp_path: Path) -> None:
    """A venv copied or moved from where it was made: its scripts name the old path's
    interpreter, which the nodes would not have once it is pushed to the new one."""
    made, moved = tmp_path / "made", tmp_path / "moved"
    for root in (made, moved):
        (root / "bin").mkdir(parents=True)
        (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (root / "bin" / "python").symlink_to("/usr/bin/python3")
        (root / "bin" / "torchrun").write_text(f"#!{made}/bin/python\nimport sys\n")
        (root / "bin" / "helper").write_text("#!/usr/bin/env python3\n")  # names no path
    assert environment_source(str(made / "bin" / "python")).root == str(made)
    with pytest.raises(UsageError) as refused:
        environment_source(str(moved / "bin" / "python"))
    assert f"{moved} was made at another path" in str(refused.value)
    assert f"bin/torchrun) run {made}/bin/python" in str(refused.value)
    assert f"--python {made}/bin/python" in (refused.value.hint or "")


def test_manifests_of_environments_not_pushed_for_a_month_are_forgotten(tmp_path, monkeypatch):
    from orchestrator.envpush import push as envpush

    monkeypatch.setattr(envpush.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = _environment(tmp_path / "env", {"a.py": "a\n"})
    envpush.head_manifest(str(root))
    kept = tmp_path / "tmp" / f"orch-{os.getuid()}" / "env-manifests"
    [own] = list(kept.iterdir())
    old, recent = kept / "old", kept / "recent"
    for path in (old, recent, own):
        path.touch()
    month_ago = time.time() - envpush.MANIFEST_KEPT_S - 60
    for path in (old, own):  # the environment pushed now keeps its own, however old
        os.utime(path, (month_ago, month_ago))
    envpush.head_manifest(str(root))
    assert sorted(p.name for p in kept.iterdir()) == sorted([own.name, "recent"])
