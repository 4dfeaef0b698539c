"""A file's sha256, read a chunk at a time: the same as hashing its whole bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from orchestrator.remote.digest import CHUNK, sha256_of


def test_a_file_of_several_chunks_hashes_as_its_bytes_do(tmp_path: Path) -> None:
    data = bytes(range(256)) * (CHUNK // 256 * 2 + 3)  # two chunks and a part
    (tmp_path / "big").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_of(tmp_path / "big") == hashlib.sha256(data).hexdigest()
    assert sha256_of(str(tmp_path / "empty")) == hashlib.sha256(b"").hexdigest()


def test_a_file_that_cannot_be_read_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        sha256_of(tmp_path / "missing")
    with pytest.raises(OSError):
        sha256_of(tmp_path)  # a directory
