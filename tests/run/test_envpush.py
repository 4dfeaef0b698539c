"""`orch env push` on values and on local directories: the delta, the refusals, and the
node side's build-and-swap (a wrong hash leaves the old environment as it was)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.probe.facts import Environment
from orchestrator.remote import envpush as node_side
from orchestrator.run.envpush import EnvSource, delta, environment_source, refusal

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
        ({**SEEN, "running": [4242]}, 0, "processes run from /opt/envs/train (pids 4242)"),
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


def _tar(files: dict[str, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


def test_the_node_builds_beside_and_swaps_or_keeps_the_old(tmp_path: Path) -> None:
    root = tmp_path / "env"
    root.mkdir()
    (root / "kept.py").write_text("kept\n")
    (root / "old.py").write_text("old\n")
    new = b"new\n"
    entry = ["f", 4, hashlib.sha256(new).hexdigest(), 0o644]
    request = {"root": str(root), "remove": ["old.py"], "dirs": {"pkg": 0o755},
               "send": {"pkg/new.py": entry}}  # fmt: skip
    bad = {**request, "send": {"pkg/new.py": ["f", 4, "0" * 64, 0o644]}}
    answer = node_side.receive(bad, _tar({"pkg/new.py": new}))
    assert answer["ok"] is False and "sha256 does not match" in answer["error"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env"]  # nothing half-written
    assert (root / "old.py").exists()

    answer = node_side.receive(request, _tar({"pkg/new.py": new}))
    assert answer["ok"] is True and answer["received"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env"]
    assert (root / "pkg" / "new.py").read_bytes() == new and not (root / "old.py").exists()
    assert (root / "kept.py").read_text() == "kept\n"
    # the next look reads the recorded hashes instead of the files
    recorded = json.loads((root / node_side.MANIFEST_NAME).read_text())
    assert set(recorded) == {"kept.py", "pkg/new.py"}
    again = node_side.manifest(str(root), recorded)
    assert again["pkg/new.py"][2] == hashlib.sha256(new).hexdigest()


def test_the_heads_manifest_reads_only_files_changed_since_the_last_push(tmp_path, monkeypatch):
    from orchestrator.run import envpush

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

