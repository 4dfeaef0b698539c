"""A node's filesystems as the node programs use them: the free space where a path is or
will be, two paths exchanged in one step."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from orchestrator.remote.filesystem import exchange, free_bytes, nearest_existing


def test_a_path_not_made_yet_is_asked_about_where_its_nearest_ancestor_is(
    tmp_path: Path,
) -> None:
    (tmp_path / "made").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")

    assert nearest_existing(str(tmp_path / "made" / "a" / "b")) == str(tmp_path / "made")
    assert nearest_existing(str(tmp_path / "dangling")) == str(tmp_path)  # no filesystem there
    assert nearest_existing("/") == "/"
    assert free_bytes(str(tmp_path / "dangling" / "x")) == free_bytes(str(tmp_path)) > 0


def test_two_directories_are_exchanged_whole(tmp_path: Path) -> None:
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir()
    old.mkdir()
    (new / "file").write_text("new")
    (old / "file").write_text("old")

    try:
        exchange(str(new), str(old))
    except OSError as err:  # a filesystem without RENAME_EXCHANGE: said, nothing moved
        assert f"cannot exchange {new} and {old}" in str(err)
        assert (new / "file").read_text() == "new"
        pytest.skip(f"this filesystem cannot exchange: {err}")

    assert (old / "file").read_text() == "new" and (new / "file").read_text() == "old"


def test_an_exchange_with_nothing_there_is_refused_with_both_paths(tmp_path: Path) -> None:
    (tmp_path / "new").mkdir()

    with pytest.raises(OSError, match=f"cannot exchange {tmp_path / 'new'} and ") as raised:
        exchange(str(tmp_path / "new"), str(tmp_path / "missing"))

    assert raised.value.errno in (errno.ENOENT, errno.EINVAL, errno.ENOSYS)
