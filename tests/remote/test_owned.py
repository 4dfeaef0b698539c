"""The user's own directories, made and checked (remote/owned.py), on real directories in a
temporary directory: a link planted where a directory will be, a directory others can
write, another user's, and a loose umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.remote import owned

ME = os.getuid()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_users_directory_is_named_by_uid_under_its_base() -> None:
    assert owned.default_directory(1000) == "/tmp/orch-1000"
    assert owned.default_directory(0, "/scratch/tmp") == "/scratch/tmp/orch-0"
    assert owned.user_directory(4242) == "/tmp/orch-4242"  # nothing there: the default


def test_directories_made_under_a_loose_umask_are_still_private(tmp_path: Path) -> None:
    old = os.umask(0o002)  # many clusters' login umask, with per-project groups
    try:
        deepest = owned.private_directories(str(tmp_path / "orch-u"), ["runs", "job", "n1"], ME)
    finally:
        os.umask(old)
    assert deepest == str(tmp_path / "orch-u" / "runs" / "job" / "n1")
    for made in (tmp_path / "orch-u", tmp_path / "orch-u" / "runs", Path(deepest)):
        assert _mode(made) == 0o700
    assert os.umask(old) == old  # the caller's umask is given back
    owned.private_directories(str(tmp_path / "orch-u"), ["runs", "job", "n1"], ME)  # again: ok


def test_a_link_planted_where_a_directory_will_be_is_refused(tmp_path: Path) -> None:
    top = tmp_path / "orch-u"
    owned.private_directory(str(top), ME)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (top / "runs").symlink_to(theirs)
    with pytest.raises(owned.UnsafeDirectory, match=f"{top / 'runs'} .*symbolic link"):
        owned.private_directories(str(top), ["runs", "job"], ME)
    assert list(theirs.iterdir()) == []  # nothing made through the link


def test_a_link_at_the_top_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    (tmp_path / "orch-u").symlink_to(theirs)
    with pytest.raises(owned.UnsafeDirectory, match=r"symbolic link.*rm -rf -- "):
        owned.private_directories(str(tmp_path / "orch-u"), ["runs"], ME)
    assert list(theirs.iterdir()) == []


def test_a_group_writable_directory_is_refused_naming_owner_mode_and_fix(tmp_path: Path) -> None:
    loose = tmp_path / "orch-u"
    loose.mkdir()
    loose.chmod(0o770)
    with pytest.raises(owned.UnsafeDirectory) as refused:
        owned.private_directories(str(loose), ["runs"], ME)
    said = str(refused.value)
    assert str(loose) in said and "mode 0770" in said and f"uid {ME}" in said
    assert "writable by others" in said and f"chmod go-w -- {loose}" in said
    assert not (loose / "runs").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "orch-u"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)  # nobody's
    with pytest.raises(owned.UnsafeDirectory, match=r"uid 65534.*another user"):
        owned.private_directories(str(theirs), ["runs"], ME)


def test_a_private_file_is_written_without_following_a_link(tmp_path: Path) -> None:
    target = tmp_path / "theirs.py"
    target.write_text("theirs\n")
    link = tmp_path / "orch_rank.py"
    link.symlink_to(target)
    with pytest.raises(OSError):
        owned.write_private_file(str(link), b"mine\n")
    assert target.read_text() == "theirs\n"
    plain = tmp_path / "rank.json"
    plain.write_text("old, and long\n")
    plain.chmod(0o644)
    owned.write_private_file(str(plain), b"new\n")
    assert plain.read_bytes() == b"new\n" and _mode(plain) == 0o600
