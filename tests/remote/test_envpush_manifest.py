"""`orch env push`'s manifests: what an environment holds, what a node lacks of the head's,
and the record of the last push that spares hashing what did not change."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from _envpush_stream import environment

from orchestrator.remote import envpush_manifest as em


def test_the_manifest_names_directories_links_and_files_and_skips_caches(tmp_path: Path) -> None:
    root = environment(tmp_path / "env", {"pkg/a.py": "a\n", "pkg/__pycache__/a.pyc": "x",
                                          "b.pyc": "x", em.MANIFEST_NAME: "{}",
                                          em.MARKER_PREFIX + "1": ""})  # fmt: skip
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    os.chmod(root / "pkg" / "a.py", 0o640)
    found = em.manifest(str(root))
    assert found == {
        ".": ["d", 0, "", os.stat(root).st_mode & 0o7777],
        "bin": ["d", 0, "", os.stat(root / "bin").st_mode & 0o7777],
        "pkg": ["d", 0, "", os.stat(root / "pkg").st_mode & 0o7777],
        "bin/python": ["l", 0, "/usr/bin/python3", 0],
        "pkg/a.py": ["f", 2, hashlib.sha256(b"a\n").hexdigest(), 0o640],
    }


def test_a_bytecode_cache_names_its_source_whatever_the_interpreter() -> None:
    assert em.cache_source("pkg/__pycache__/a.cpython-311.pyc") == "pkg/a.py"
    assert em.cache_source("x/pkg/__pycache__/a.cpython-310.opt-1.pyc") == "x/pkg/a.py"
    assert em.cache_source("__pycache__/a.pypy39.pyc") == "a.py"
    for not_a_cache in ("pkg/a.pyc", "pkg/__pycache__/a.py", "pkg/__pycache__/.pyc",
                        "pkg/cache/a.cpython-311.pyc", "a.cpython-311.pyc"):  # fmt: skip
        assert em.cache_source(not_a_cache) is None, not_a_cache


def test_the_heads_bytecode_is_listed_for_the_files_sent_only(tmp_path: Path) -> None:
    root = environment(tmp_path / "env", {
        "pkg/a.py": "a\n", "pkg/b.py": "b\n", "top.py": "t\n", "data.txt": "d\n",
        "pkg/__pycache__/a.cpython-311.pyc": "a311", "pkg/__pycache__/a.cpython-310.pyc": "a310",
        "pkg/__pycache__/b.cpython-311.pyc": "b311", "pkg/__pycache__/ab.cpython-311.pyc": "ab",
        "__pycache__/top.cpython-311.pyc": "top",
    })  # fmt: skip
    (root / "pkg/__pycache__/a.cpython-39.pyc").symlink_to("a.cpython-311.pyc")
    found = em.caches_of(str(root), ["pkg/a.py", "top.py", "data.txt", "missing/c.py"])
    assert found == {
        "pkg/__pycache__/a.cpython-311.pyc": [4, hashlib.sha256(b"a311").hexdigest()],
        "pkg/__pycache__/a.cpython-310.pyc": [4, hashlib.sha256(b"a310").hexdigest()],
        "__pycache__/top.cpython-311.pyc": [3, hashlib.sha256(b"top").hexdigest()],
    }  # b.py not sent, ab is another module's, the link is no regular file


def test_the_stream_lists_the_caches_apart_from_the_environment() -> None:
    head = {".": ["d", 0, "", 0o755], "a.py": ["f", 2, "h", 0o644]}
    sent = {**head, em.STREAM_CACHES: ["c", 0, {"__pycache__/a.cpython-311.pyc": [3, "s"]}, 0]}
    assert em.take_caches(sent) == {"__pycache__/a.cpython-311.pyc": [3, "s"]}
    assert sent == head
    assert em.take_caches(dict(head)) == {}  # a stream with none


def test_the_record_of_the_last_push_spares_hashing_unchanged_files(tmp_path: Path) -> None:
    root = environment(tmp_path / "env", {"a.py": "a\n", "b.py": "b\n"})
    assert em.recorded(str(root)) == {}
    em.record(str(root), em.manifest(str(root)))
    kept = em.recorded(str(root))
    assert set(kept) == {"a.py", "b.py"}
    assert kept == em.with_mtimes(str(root), em.manifest(str(root)))
    kept["a.py"][2] = "taken from the record"  # same size and mtime: not read again
    (root / "b.py").write_text("bb\n")  # another size: read again
    again = em.manifest(str(root), kept)
    assert again["a.py"][2] == "taken from the record"
    assert again["b.py"][2] == hashlib.sha256(b"bb\n").hexdigest()


def test_the_delta_is_what_makes_the_nodes_manifest_the_heads() -> None:
    head = {"bin": ["d", 0, "", 0o755], "a.py": ["f", 10, "aa", 0o644],
            "b.py": ["f", 20, "bb", 0o644]}  # fmt: skip
    node = {"a.py": ["f", 10, "aa", 0o644], "b.py": ["f", 20, "old", 0o644],
            "stale.py": ["f", 5, "ss", 0o644]}  # fmt: skip
    assert em.delta(head, node) == {"send": {"b.py": ["f", 20, "bb", 0o644]},
                                    "remove": ["stale.py"], "dirs": {"bin": 0o755},
                                    "bytes": 20}  # fmt: skip


def test_a_packed_manifest_unpacks_as_it_was() -> None:
    found = {"a.py": ["f", 10, "aa", 0o644], "bin": ["d", 0, "", 0o755]}
    assert em.unpack(em.pack(found)) == found


def test_the_record_is_the_users_alone_and_never_written_through_a_link(tmp_path: Path) -> None:
    root = environment(tmp_path / "env", {"a.py": "a\n"})
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("theirs")
    (root / em.MANIFEST_NAME).symlink_to(elsewhere)  # planted where the record goes
    umask = os.umask(0o002)
    try:
        em.record(str(root), em.manifest(str(root)))
    finally:
        os.umask(umask)
    cache = os.lstat(root / em.MANIFEST_NAME)
    assert stat.S_ISREG(cache.st_mode) and stat.S_IMODE(cache.st_mode) == 0o600
    assert elsewhere.read_text() == "theirs" and set(em.recorded(str(root))) == {"a.py"}
    os.chmod(root / em.MANIFEST_NAME, 0o664)  # others could have written it: not used
    assert em.recorded(str(root)) == {}


def test_a_file_replaced_or_not_the_users_own_is_read_again(tmp_path: Path) -> None:
    root = environment(tmp_path / "env", {"a.py": "a\n"})
    kept = em.with_mtimes(str(root), em.manifest(str(root)))
    kept["a.py"][2] = "taken from the record"
    assert em.manifest(str(root), kept)["a.py"][2] == "taken from the record"
    before = os.lstat(root / "a.py")
    (root / "b.py").write_text("A\n")
    os.replace(root / "b.py", root / "a.py")  # another file, with the same size and mtime
    os.utime(root / "a.py", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert em.manifest(str(root), kept)["a.py"][2] == hashlib.sha256(b"A\n").hexdigest()
    someone = os.getuid() + 1  # a node keeps no file of another user's, whatever it holds
    assert em.manifest(str(root), owner=someone)["a.py"] == ["f", 2, "", before.st_mode & 0o7777]


def test_a_directory_of_another_mode_than_the_node_gives_it_is_in_the_delta() -> None:
    head = {".": ["d", 0, "", 0o775], "lib": ["d", 0, "", 0o555], "bin": ["d", 0, "", 0o755]}
    node = {".": ["d", 0, "", 0o755], "lib": ["d", 0, "", 0o755], "bin": ["d", 0, "", 0o775]}
    # the root is never left writable by others; a directory keeps u+rwx for the next push
    assert em.delta(head, node)["dirs"] == {"bin": 0o755}
