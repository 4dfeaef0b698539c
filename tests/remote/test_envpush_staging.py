"""`orch env push` on a node, the new environment: built beside the old and swapped in, or
the old kept as it was (a wrong hash, a manifest not the head's); one push of a root at a
time."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

from _envpush_stream import environment, head_stream

from orchestrator.remote import envpush_manifest, envpush_staging


def test_the_node_builds_beside_and_swaps_or_keeps_the_old(tmp_path: Path) -> None:
    head = environment(tmp_path / "head", {"kept.py": "kept\n", "pkg/new.py": "new\n"})
    nodes = tmp_path / "node"
    root = environment(nodes / "env", {"kept.py": "kept\n", "old.py": "old\n"})
    stream, sha = head_stream(head, ["pkg/new.py"])
    answer = envpush_staging.receive(str(root), "0" * 64, stream)  # not the head's manifest
    assert answer["ok"] is False and "does not match its sha256" in answer["error"]
    assert sorted(p.name for p in nodes.iterdir()) == ["env"]  # nothing half-written
    assert (root / "old.py").exists()

    good, sha = head_stream(head, ["pkg/new.py"])
    bad = io.BytesIO(good.getvalue().replace(b"new\n", b"bad\n"))
    answer = envpush_staging.receive(str(root), sha, bad)
    assert answer["ok"] is False and "sha256 does not match" in answer["error"]
    assert sorted(p.name for p in nodes.iterdir()) == ["env"]

    answer = envpush_staging.receive(str(root), sha, good)
    assert answer["ok"] is True and answer["received"] == 1 and answer["received_bytes"] == 4
    assert sorted(p.name for p in nodes.iterdir()) == ["env"]
    assert (root / "pkg" / "new.py").read_text() == "new\n" and not (root / "old.py").exists()
    assert (root / "kept.py").read_text() == "kept\n"
    # the next look reads the recorded hashes instead of the files
    recorded = json.loads((root / envpush_manifest.MANIFEST_NAME).read_text())
    assert set(recorded) == {"kept.py", "pkg/new.py"}
    again = envpush_manifest.manifest(str(root), recorded)
    assert again["pkg/new.py"][2] == hashlib.sha256(b"new\n").hexdigest()


def test_a_second_push_of_the_same_root_waits_its_turn(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(envpush_staging.owned, "NODE_BASE", str(tmp_path))
    held = envpush_staging.take_lock(str(tmp_path / "env"))
    assert held is not None
    assert envpush_staging.take_lock(str(tmp_path / "env")) is None  # another push runs
    assert envpush_staging.take_lock(str(tmp_path / "other")) is not None
    os.close(held)
    assert envpush_staging.take_lock(str(tmp_path / "env")) is not None
