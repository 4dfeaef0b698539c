"""The checkpoint files' stream between two nodes: what a receiver takes is exactly what was
asked for, byte for byte and hash for hash; a path that would leave its directory, a file
not asked for, a wrong size, a stream cut short, a file that changed while it was read, or a
link on the way is refused; the bandwidth cap holds over the whole stream."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest
from _checkpoint_node import sha, tree

from orchestrator.remote.checkpoint_stream import (
    Claims,
    Outgoing,
    StreamError,
    UnsafePath,
    Wanted,
    read_stream,
    relative_path,
    write_stream,
)


def _stream_of(top: Path, paths: list[str], bandwidth: int = 0) -> tuple[bytes, object]:
    sink = bytearray()
    sent = write_stream(sink.extend, [Outgoing(path, str(top)) for path in paths], bandwidth)
    return bytes(sink), sent


def _crafted(*parts: tuple[dict[str, object], bytes]) -> io.BytesIO:
    body = b"".join(json.dumps(head).encode() + b"\n" + data for head, data in parts)
    return io.BytesIO(body)


def _every_file(top: Path) -> list[str]:
    return sorted(p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file())


FILES = {"step10/model.pt": os.urandom(3 << 20) + b"tail", "step10/zero/shard_0.pt": b"z" * 10,
         "step10/empty": b""}  # fmt: skip


def test_the_files_asked_for_arrive_byte_for_byte_with_their_sha256(tmp_path: Path) -> None:
    tree(tmp_path / "from", FILES)
    data, sent = _stream_of(tmp_path / "from", sorted(FILES))
    into = tmp_path / "into"
    into.mkdir()
    wanted = {path: Wanted(len(body)) for path, body in FILES.items()}

    got = read_stream(io.BytesIO(data), wanted, str(into))

    assert sent.changed == () and sent.sha256 == {p: sha(b) for p, b in FILES.items()}
    assert got.bytes == sum(len(body) for body in FILES.values())
    assert {path: digest.sha256 for path, digest in got.files.items()} == sent.sha256
    for path, body in FILES.items():
        assert (into / path).read_bytes() == body
        assert (into / path).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a\0b", ""])
def test_a_path_that_would_leave_its_directory_is_no_path(path: str) -> None:
    with pytest.raises(UnsafePath):
        relative_path(path)


@pytest.mark.parametrize("path", ["../x", "/tmp/x", "step10/../../x"])
def test_the_reader_refuses_a_path_outside_its_directory(tmp_path: Path, path: str) -> None:
    into = tmp_path / "into"
    into.mkdir()
    source = _crafted(({"path": path, "size": 1}, b"x"), ({"end": True}, b""))

    with pytest.raises(StreamError, match="not allowed"):
        read_stream(source, {path: Wanted(1)}, str(into))
    assert not (tmp_path / "x").exists() and _every_file(into) == []


def test_the_reader_refuses_a_file_it_did_not_ask_for(tmp_path: Path) -> None:
    tree(tmp_path / "from", FILES)
    data, _ = _stream_of(tmp_path / "from", ["step10/zero/shard_0.pt", "step10/empty"])
    into = tmp_path / "into"
    into.mkdir()

    with pytest.raises(StreamError, match="step10/empty, which was not asked for"):
        read_stream(io.BytesIO(data), {"step10/zero/shard_0.pt": Wanted(10)}, str(into))


def test_a_size_other_than_asked_means_the_file_changed(tmp_path: Path) -> None:
    tree(tmp_path / "from", FILES)
    data, _ = _stream_of(tmp_path / "from", ["step10/zero/shard_0.pt"])
    into = tmp_path / "into"
    into.mkdir()

    with pytest.raises(StreamError, match="10 bytes, not the 9 asked for") as raised:
        read_stream(io.BytesIO(data), {"step10/zero/shard_0.pt": Wanted(9)}, str(into))
    assert raised.value.changed == ("step10/zero/shard_0.pt",)


def test_a_stream_cut_short_or_altered_on_the_way_is_refused(tmp_path: Path) -> None:
    tree(tmp_path / "from", FILES)
    data, _ = _stream_of(tmp_path / "from", ["step10/model.pt"])
    wanted = {"step10/model.pt": Wanted(len(FILES["step10/model.pt"]))}
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    no_trailer = data[: data.rindex(b'{"end"')]
    for name, body, said in (("cut", data[: len(data) // 2], "ended in the middle"),
                             ("flipped", bytes(flipped), "another sha256"),
                             ("no trailer", no_trailer, "ended early")):  # fmt: skip
        into = tmp_path / name
        into.mkdir()
        with pytest.raises(StreamError, match=said):
            read_stream(io.BytesIO(body), wanted, str(into))


def test_a_sha256_other_than_asked_is_refused(tmp_path: Path) -> None:
    tree(tmp_path / "from", FILES)
    data, _ = _stream_of(tmp_path / "from", ["step10/zero/shard_0.pt"])
    into = tmp_path / "into"
    into.mkdir()

    with pytest.raises(StreamError, match=r"not the \w+ asked for"):
        read_stream(io.BytesIO(data), {"step10/zero/shard_0.pt": Wanted(10, sha(b"y" * 10))},
                    str(into))  # fmt: skip


def test_a_file_that_changes_while_read_is_named_and_not_taken(tmp_path: Path) -> None:
    tree(tmp_path / "from", FILES)
    target = tmp_path / "from" / "step10" / "model.pt"
    sink = bytearray()

    def send(data: bytes) -> None:
        if not sink:  # the writer saves again just as the file is sent
            with target.open("ab") as handle:
                handle.write(b"more")
        sink.extend(data)

    sent = write_stream(send, [Outgoing("step10/model.pt", str(tmp_path / "from"))])
    into = tmp_path / "into"
    into.mkdir()

    assert sent.changed == ("step10/model.pt",)
    with pytest.raises(StreamError, match="changed while sent") as raised:
        wanted = {"step10/model.pt": Wanted(len(FILES["step10/model.pt"]))}
        read_stream(io.BytesIO(bytes(sink)), wanted, str(into))
    assert raised.value.changed == ("step10/model.pt",)


def test_links_are_never_followed_reading_or_writing(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret").write_bytes(b"not a checkpoint")
    source = tmp_path / "from"
    source.mkdir()
    (source / "step10").symlink_to(elsewhere)
    data, sent = _stream_of(source, ["step10/secret"])
    assert sent.changed == ("step10/secret",) and b"not a checkpoint" not in data

    into = tmp_path / "into"
    into.mkdir()
    (into / "step10").symlink_to(elsewhere)
    crafted = _crafted(({"path": "step10/new", "size": 2}, b"hi"), ({"end": True}, b""))
    with pytest.raises(StreamError, match="cannot be created"):
        read_stream(crafted, {"step10/new": Wanted(2)}, str(into))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["secret"]


def test_two_streams_into_one_directory_bring_each_file_once(tmp_path: Path) -> None:
    tree(tmp_path / "from", FILES)
    data, _ = _stream_of(tmp_path / "from", ["step10/zero/shard_0.pt"])
    into = tmp_path / "into"
    into.mkdir()
    claims, wanted = Claims(), {"step10/zero/shard_0.pt": Wanted(10)}

    read_stream(io.BytesIO(data), wanted, str(into), claims)
    with pytest.raises(StreamError, match="a second time"):
        read_stream(io.BytesIO(data), wanted, str(into), claims)


def test_the_bandwidth_cap_holds_over_the_whole_stream(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"\0" * (4 << 20))

    started = time.monotonic()
    _, sent = _stream_of(tmp_path, ["big"], bandwidth=8 << 20)

    assert sent.bytes == 4 << 20
    assert time.monotonic() - started >= 0.4
