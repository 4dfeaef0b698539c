"""`orch env push` on a node, the new environment: built beside the old and swapped in, or
the old kept as it was (a wrong hash, a manifest not the head's); one push of a root at a
time."""

from __future__ import annotations

import hashlib
import io
import json
import os
import py_compile
import signal
import stat
from pathlib import Path

import pytest
from _envpush_stream import environment, head_stream

from orchestrator.remote import envpush_manifest, envpush_staging
from orchestrator.remote.envpush import look


@pytest.mark.process
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


# ----- what the node builds: the head's tree, with the head's links and modes ---------------
def _push(head: Path, root: Path, stream_of=None, staging=None) -> dict:
    """One push of `head` to `root` as the head runs it: the node's look, the files it
    lacks in the stream, its receive (`stream_of` may wrap the stream)."""
    seen = look({"root": str(root), "marker": ".orch-push-marker-x"})["manifest"]
    have = envpush_manifest.unpack(seen) if seen else {}
    lacks = envpush_manifest.delta(envpush_manifest.manifest(str(head)), have)["send"]
    stream, sha = head_stream(head, sorted(lacks))
    stream = stream_of(stream) if stream_of else stream
    return envpush_staging.receive(str(root), sha, stream, staging)


def _venv(root: Path, files: dict[str, str]) -> Path:
    """An environment laid out as a venv is: lib64 a link to lib, bin/python a link out."""
    environment(root, {"lib/python3/site-packages/pkg/__init__.py": "one\n", **files})
    (root / "lib64").symlink_to("lib")
    (root / "bin").mkdir(exist_ok=True)
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    return root


def _tree(root: Path) -> dict:
    """The root's manifest as a fresh look sees it (nothing taken from the record)."""
    return envpush_manifest.manifest(str(root))


@pytest.mark.process
def test_a_link_to_a_directory_stays_a_link_with_its_target(tmp_path: Path) -> None:
    head = _venv(tmp_path / "head", {})
    root = tmp_path / "node" / "env"
    assert _push(head, root)["ok"] is True  # the first push: everything sent
    (head / "lib/python3/site-packages/added.py").write_text("added\n")  # a package added
    answer = _push(head, root)  # the node rebuilds from what it has
    assert answer["ok"] is True and answer["received"] == 1
    assert (root / "lib64").is_symlink() and os.readlink(root / "lib64") == "lib"
    assert os.readlink(root / "bin" / "python") == "/usr/bin/python3"
    assert _tree(root) == _tree(head)
    answer = _push(head, root)  # a second push finds nothing to send, nothing to fix
    assert answer["ok"] is True and answer["received"] == 0
    assert (root / "lib64").is_symlink() and _tree(root) == _tree(head)


def _pyc_validates(pyc: Path, source: Path) -> bool:
    """Whether an interpreter takes `pyc` for `source` as it stands (a timestamp pyc: the
    source's mtime and size in its header)."""
    header, info = pyc.read_bytes()[4:16], os.stat(source)
    flags, mtime, size = (int.from_bytes(header[i:i + 4], "little") for i in (0, 4, 8))
    return flags == 0 and mtime == int(info.st_mtime) & 0xFFFFFFFF and size == info.st_size


@pytest.mark.process
def test_the_heads_bytecode_of_the_files_sent_arrives_and_is_valid_there(tmp_path: Path) -> None:
    """Every process the job starts would compile what it imports where bytecode is not
    written (PYTHONDONTWRITEBYTECODE): the head's comes with the files, checked by hash."""
    site = "lib/python3/site-packages/pkg"
    head = _venv(tmp_path / "head", {f"{site}/mod.py": "VALUE = 1\n"})
    cache = head / site / "__pycache__"
    py_compile.compile(str(head / site / "mod.py"), cfile=str(cache / "mod.cpython-311.pyc"))
    (cache / "mod.cpython-310.pyc").write_bytes(b"another interpreter's")
    (cache / "gone.cpython-311.pyc").write_bytes(b"the bytecode of no file")
    root = tmp_path / "node" / "env"

    def altered(stream: io.BytesIO) -> io.BytesIO:  # on its way: that cache is dropped
        return io.BytesIO(stream.getvalue().replace(b"interpreter's", b"interpreter!s"))

    assert _push(head, root, stream_of=altered)["ok"] is True
    assert sorted(p.name for p in (root / site / "__pycache__").iterdir()) == [
        "mod.cpython-311.pyc"]  # fmt: skip

    (head / site / "mod.py").write_text("VALUE = 2\n")  # changed: sent again, with its own
    os.utime(head / site / "mod.py", (1_700_000_000, 1_700_000_000))
    py_compile.compile(str(head / site / "mod.py"), cfile=str(cache / "mod.cpython-311.pyc"))
    answer = _push(head, root)
    assert answer["ok"] is True and answer["received"] == 1
    got = root / site / "__pycache__"
    assert sorted(p.name for p in got.iterdir()) == ["mod.cpython-310.pyc", "mod.cpython-311.pyc"]
    assert (got / "mod.cpython-311.pyc").read_bytes() == (
        cache / "mod.cpython-311.pyc").read_bytes()  # fmt: skip
    assert _pyc_validates(got / "mod.cpython-311.pyc", root / site / "mod.py")
    assert _tree(root) == _tree(head)  # bytecode is no part of the environment
    recorded = json.loads((root / envpush_manifest.MANIFEST_NAME).read_text())
    assert not [rel for rel in recorded if "__pycache__" in rel]


@pytest.mark.process
def test_the_new_environment_has_the_heads_modes_whatever_the_umask(tmp_path: Path) -> None:
    head = _venv(tmp_path / "head", {"bin/tool": "#!/bin/sh\n", "secret.cfg": "x\n"})
    for rel, mode in ((".", 0o755), ("lib", 0o750), ("bin/tool", 0o755), ("secret.cfg", 0o600)):
        os.chmod(head / rel, mode)
    root = tmp_path / "node" / "env"
    umask = os.umask(0o002)  # a node's non-interactive ssh session
    try:
        assert _push(head, root)["ok"] is True
        (head / "lib/python3/site-packages/added.py").write_text("added\n")
        os.chmod(head / "lib/python3/site-packages/added.py", 0o644)
        assert _push(head, root)["ok"] is True  # rebuilt from the first
    finally:
        os.umask(umask)
    mode = {rel: stat.S_IMODE(os.lstat(root / rel).st_mode)
            for rel in (".", "lib", "bin", "bin/tool", "secret.cfg")}  # fmt: skip
    assert mode == {".": 0o755, "lib": 0o750, "bin": stat.S_IMODE(os.stat(head / "bin").st_mode),
                    "bin/tool": 0o755, "secret.cfg": 0o600}  # fmt: skip
    cache = os.lstat(root / envpush_manifest.MANIFEST_NAME)
    assert stat.S_IMODE(cache.st_mode) == 0o600
    writable = [p for p in [root, *root.rglob("*")] if not p.is_symlink()
                and os.lstat(p).st_mode & stat.S_IWGRP]  # fmt: skip
    assert writable == []


@pytest.mark.process
@pytest.mark.parametrize("which", ["root", "record"])
def test_a_root_or_record_others_can_write_is_refused_naming_it(tmp_path: Path, which) -> None:
    head = environment(tmp_path / "head", {"a.py": "a\n"})
    root = tmp_path / "node" / "env"
    assert _push(head, root)["ok"] is True
    path = root if which == "root" else root / envpush_manifest.MANIFEST_NAME
    os.chmod(path, os.stat(path).st_mode | 0o020)  # another of the group may write it
    (head / "a.py").write_text("aa\n")
    answer = _push(head, root)
    assert answer["ok"] is False and (root / "a.py").read_text() == "a\n"  # kept as it was
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert answer["error"].startswith(f"{path} (owner ")
    assert f"mode {mode:04o}) is writable by others" in answer["error"]
    assert (f"chmod go-w -- {path}" if which == "root" else f"rm -f -- {path}") in answer["fix"]
    seen = look({"root": str(root), "marker": ".orch-push-marker-x"})
    assert seen["manifest"] is None and seen["refused"] == {"problem": answer["error"],
                                                            "fix": answer["fix"]}  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == ["env"]


def test_a_root_or_record_of_another_user_is_refused(tmp_path: Path) -> None:
    root = environment(tmp_path / "env", {envpush_manifest.MANIFEST_NAME: "{}"})
    someone = os.getuid() + 1
    problem = envpush_manifest.root_problem(str(root), uid=someone)
    assert problem is not None and "belongs to another user" in problem.message
    assert f"rm -rf -- {root}" in problem.fix
    os.chmod(root, 0o755)
    cache = root / envpush_manifest.MANIFEST_NAME
    cache.unlink()
    cache.symlink_to(tmp_path / "elsewhere.json")  # a link planted in its place
    problem = envpush_manifest.root_problem(str(root))
    assert problem is not None and "is a symbolic link" in problem.message
    assert envpush_manifest.recorded(str(root)) == {}


# ----- a file taken from the old tree and written in place during the build ----------------
class _WritesDuringTheBuild(io.RawIOBase):
    """The head's stream, read as the node reads it; once the build has laid out the new
    tree (the second read), a process writes `path` in place."""

    def __init__(self, stream: io.BytesIO, path: Path) -> None:
        super().__init__()
        self.stream, self.path, self.reads = stream, path, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self.reads += 1
        if self.reads == 2:
            with open(self.path, "r+b") as handle:
                handle.write(b"KEPT\n")  # the same size, a new mtime
        data = self.stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


@pytest.mark.process
def test_a_kept_file_written_in_place_during_the_build_is_caught(tmp_path: Path) -> None:
    big = "x" * (3 << 20)  # a stream the node reads in several reads
    head = environment(tmp_path / "head", {"kept.py": "kept\n", "big.bin": big})
    root = environment(tmp_path / "node" / "env", {"kept.py": "kept\n"})
    os.utime(root / "kept.py", (1e9, 1e9))
    answer = _push(head, root, lambda s: _WritesDuringTheBuild(s, root / "kept.py"))
    assert answer["ok"] is False, answer
    assert f"{root}/kept.py was written while the push built" in answer["error"]
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == ["env"]
    assert not (root / "big.bin").exists()  # the old one, as the writer left it
    # pushed again, the node sends for it: the record never vouched for what it holds
    assert _push(head, root)["ok"] is True and (root / "kept.py").read_text() == "kept\n"


@pytest.mark.process
def test_the_record_never_vouches_for_a_file_written_after_it_was_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = environment(tmp_path / "head", {"kept.py": "kept\n", "new.py": "new\n"})
    root = environment(tmp_path / "node" / "env", {"kept.py": "kept\n"})
    os.utime(root / "kept.py", (1e9, 1e9))
    real_record = envpush_manifest.record

    def written_first(where: str, found: dict, *args) -> None:
        (root / "kept.py").write_text("KEPT\n")  # in the old tree, so in the new one too
        real_record(where, found, *args)

    monkeypatch.setattr(envpush_manifest, "record", written_first)
    assert _push(head, root)["ok"] is True
    monkeypatch.undo()
    recorded = envpush_manifest.recorded(str(root))
    assert envpush_manifest.manifest(str(root), recorded) == _tree(root)
    assert _push(head, root)["received"] == 1 and (root / "kept.py").read_text() == "kept\n"


# ----- the head going away: the build stops, the swap is whole or not at all ----------------
def test_a_signal_during_a_read_stops_the_build_and_keeps_the_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))  # the program's end
    head = environment(tmp_path / "head", {"a.py": "new\n", "big.bin": "x" * (3 << 20)})
    root = environment(tmp_path / "node" / "env", {"a.py": "old\n"})
    staging = envpush_staging.Staging(str(root))

    class Interrupted(io.RawIOBase):  # SIGHUP arrives while the node waits for the stream
        def __init__(self, stream: io.BytesIO) -> None:
            super().__init__()
            self.stream, self.reads = stream, 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            self.reads += 1
            if self.reads == 2:
                staging._interrupted(signal.SIGHUP, None)
            data = self.stream.read(len(buffer))
            buffer[: len(data)] = data
            return len(data)

    answer = _push(head, root, Interrupted, staging)
    assert exits == []  # the main thread stopped the build itself, and answers
    assert answer == {"ok": False, "error": f"the head went away (signal {signal.SIGHUP})"}
    assert staging.code == 128 + signal.SIGHUP and (root / "a.py").read_text() == "old\n"
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == ["env"]
