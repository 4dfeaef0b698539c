"""`orch env push`'s node program as it is shipped (envpush/push.py's PUSH_SOURCE): run by an
interpreter that has no orch, with only the parts loaded beside it, it looks and receives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _envpush_stream import environment, head_stream
from _shipped import not_loaded_before

from orchestrator.envpush.push import PUSH_PARTS, PUSH_SOURCE
from orchestrator.remote import envpush_manifest

# No site-packages, no PYTHONPATH, no current directory: orch is not importable.
BARE = [sys.executable, "-I", "-S"]


def _shipped(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*BARE, "-c", PUSH_SOURCE, *args], input=stdin, capture_output=True,
                          timeout=60, check=False)  # fmt: skip


def test_every_part_is_loaded_after_the_parts_it_imports() -> None:
    assert not_loaded_before(PUSH_PARTS, "envpush") == []


def test_the_shipped_program_looks_without_orch(tmp_path: Path) -> None:
    bare = subprocess.run([*BARE, "-c", "import orchestrator"], capture_output=True, check=False)
    assert bare.returncode != 0  # what follows runs on the shipped parts alone
    root = environment(tmp_path / "env", {"a.py": "a\n", "pkg/b.py": "b\n"})
    done = _shipped("look", json.dumps({"root": str(root), "marker": ".orch-push-marker-x"}))
    assert done.returncode == 0, done.stderr.decode()
    seen = json.loads(done.stdout)
    assert seen["exists"] is True and seen["shared"] is False and seen["running"] == []
    assert envpush_manifest.unpack(seen["manifest"]) == envpush_manifest.manifest(str(root))


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
