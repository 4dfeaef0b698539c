"""The wire format: what a node sends through pdsh is safe for pdsh and loses nothing."""

from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.remote import logwire
from orchestrator.remote.logwire import (
    CHUNK_BYTES,
    WireFramer,
    decode_wire,
    encode_control,
    escape_payload,
    parse_wire,
    shorten_control,
    unescape_payload,
)

# Wire lines must fit pdsh's 128 KiB line buffer with room for its `node: ` prefix.
PDSH_LINE_LIMIT = 128 * 1024 - 256


def frame_all(stream: str, chunks: list[bytes], rank: str = "",
              max_line: int | None = None) -> list[bytes]:  # fmt: skip
    framer = WireFramer(stream, rank, max_line)
    wire: list[bytes] = []
    for chunk in chunks:
        wire += framer.feed(chunk)
    return wire + framer.flush()


def join_records(wire: list[bytes]) -> list[tuple[str, bytes]]:
    """(kind, data) per logical record, chunks rejoined; the way the head reads the wire."""
    out: list[tuple[str, bytes]] = []
    pending = b""
    for line in wire:
        record = decode_wire(line)
        assert record is not None, line
        if record.more:
            pending += record.data
            continue
        kind = record.kind if record.newline else "partial"
        out.append((kind, pending + record.data))
        pending = b""
    assert pending == b""
    return out


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@given(st.binary())
def test_escape_round_trips_any_bytes(data: bytes) -> None:
    clean = data.replace(b"\n", b"").replace(b"\r", b"")
    escaped = escape_payload(clean)
    assert unescape_payload(escaped) == clean
    assert b"\x00" not in escaped
    escaped.decode("utf-8")  # always valid UTF-8 on the wire


def test_valid_utf8_passes_unchanged() -> None:
    text = "loss 0.25 ✓ über 步骤".encode()
    assert escape_payload(text) is text


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from([b"a", b"bc", "é".encode(), b"\xff", b"\\", b"\x00", b"\n", b"\t"])),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=6),
)
def test_lines_round_trip_in_any_chunking(parts: list[bytes], cuts: list[int]) -> None:
    data = b"".join(parts)
    records = join_records(frame_all("out", chunked(data, cuts)))
    expected = data.split(b"\n")
    last = expected.pop()
    assert [d for k, d in records if k == "line"] == expected
    assert [d for k, d in records if k == "partial"] == ([last] if last else [])


@settings(max_examples=100)
@given(st.lists(st.integers(min_value=0, max_value=3 * CHUNK_BYTES), max_size=5))
def test_long_line_is_chunked_under_pdsh_limit_and_rejoined(cuts: list[int]) -> None:
    every_byte = bytes(b for b in range(256) if b not in b"\r\n")
    long_line = every_byte * (3 * CHUNK_BYTES // 254) + b"\xff\xfe"
    data = b"start\n" + long_line + b"\nend"
    wire = frame_all("err", chunked(data, cuts))
    assert max(len(w) for w in wire) < PDSH_LINE_LIMIT
    assert all(w.count(b"\n") == 1 and b"\r" not in w and b"\x00" not in w for w in wire)
    assert join_records(wire) == [("line", b"start"), ("line", long_line), ("partial", b"end")]


def test_one_mib_line_of_invalid_utf8_fits_pdsh() -> None:
    line = b"\xff" * (1 << 20)  # worst case: every byte escaped to 4
    wire = frame_all("out", [line + b"\n"])
    assert max(len(w) for w in wire) < PDSH_LINE_LIMIT
    assert join_records(wire) == [("line", line)]


# What one of srun's messages leaves for a wire line after a long node name's label.
SRUN_ROOM = 1024 - len(b"gpu-node-with-a-long-name-017: ")
PIECES = [b"a", "é".encode(), b"\xff", b"\\", b"\x00", b"\n", b"\r", b"x" * 700, b"\xfe" * 300]


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from(PIECES), max_size=40),
    st.lists(st.integers(min_value=0, max_value=40_000), max_size=6),
    st.sampled_from(["", "0/0", "65535/65535"]),
)
def test_a_line_limit_changes_how_records_are_cut_not_what_they_say(
    parts: list[bytes], cuts: list[int], rank: str
) -> None:
    data = b"".join(parts)
    limited = frame_all("err", chunked(data, cuts), rank, SRUN_ROOM)
    assert all(len(w) <= SRUN_ROOM and w.count(b"\n") == 1 for w in limited)
    assert join_records(limited) == join_records(frame_all("err", chunked(data, cuts), rank))


def test_a_long_line_under_a_limit_goes_in_pieces_that_fit() -> None:
    line = b"loss " + b"\xff" * 5000 + "é".encode() * 2000
    wire = frame_all("out", [line + b"\nend"], "3/1", SRUN_ROOM)
    assert len(wire) > 10 and max(len(w) for w in wire) <= SRUN_ROOM
    assert join_records(wire) == [("line", line), ("partial", b"end")]


def test_a_limit_that_leaves_no_room_for_text_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        WireFramer("out", "3/1", 40)


def test_a_control_too_long_for_its_channel_has_its_longest_text_cut() -> None:
    error = "working directory /" + "d" * 3000 + " does not exist on n1"
    fields = {"code": 127, "node": "n1", "error": error, "stopped": "SIGTERM"}
    line = shorten_control("exit", fields, 1000)
    assert len(line) <= 1000
    record = decode_wire(line)
    assert record is not None and record.text == "exit"
    assert {k: v for k, v in record.fields.items() if k != "error"} == {
        "code": 127, "node": "n1", "stopped": "SIGTERM"
    }  # fmt: skip
    assert record.fields["error"].startswith("working directory /ddd")
    assert record.fields["error"].endswith("...")
    short = {"code": 0, "node": "n1"}
    assert shorten_control("exit", short, 1000) == encode_control("exit", **short)


def test_frames_of_one_read_are_collapsed_and_final_frame_is_a_line() -> None:
    stream = b"".join(b"\r%3d%%|" % i + b"#" * (i // 10) for i in range(0, 101, 10)) + b"\n"
    records = join_records(frame_all("err", [stream]))
    assert records == [("line", b"100%|##########")]


def test_frames_of_separate_reads_are_each_sent() -> None:
    writes = [b"\r%3d%%|" % i for i in (0, 50, 100)] + [b"\n"]
    records = join_records(frame_all("err", writes))
    assert records == [
        ("frame", b"  0%|"),
        ("frame", b" 50%|"),
        ("frame", b"100%|"),
        ("line", b"100%|"),
    ]


def test_latest_frame_is_sent_at_once_not_when_the_next_one_starts() -> None:
    framer = WireFramer("err")
    wire = framer.feed(b"\r 10%|#")
    assert [decode_wire(w).text for w in wire] == [" 10%|#"]
    assert decode_wire(wire[0]).kind == "frame"


def test_bar_cleared_by_blank_frame_sends_its_last_frame() -> None:
    records = join_records(frame_all("err", [b"\r 50%\r100%\r     \rnext\n"]))
    assert records == [("frame", b"100%"), ("frame", b"     "), ("line", b"next")]


def test_crlf_line_keeps_its_text() -> None:
    records = join_records(frame_all("out", [b"hello\r\n"]))
    assert records == [("frame", b"hello"), ("line", b"")]


def test_control_round_trip() -> None:
    wire = encode_control("exit", code=3, node="n1", note="a\nb\x00")
    assert wire.endswith(b"\n") and wire.count(b"\n") == 1
    record = decode_wire(wire)
    assert record is not None
    assert (record.kind, record.text, record.fields) == (
        "control",
        "exit",
        {"code": 3, "node": "n1", "note": "a\nb\x00"},
    )


def test_plain_output_is_not_wire() -> None:
    assert decode_wire(b"ssh: connect to host n1 port 22: Connection refused\n") is None
    assert decode_wire(b"%o1") is None
    assert decode_wire(b"%o1K- not json") is None


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        (b"%o1Lo step 1", (ord("L"), ord("o"), b"", b"step 1")),
        (b"%o1Fe:3/1  50%", (ord("F"), ord("e"), b"3/1", b" 50%")),
        (b"%o1Po a\\\\b \\x00", (ord("P"), ord("o"), b"", b"a\\b \x00")),
        (b'%o1K- {"kind":"exit","why":"a\\\\b"}',
         (ord("K"), ord("-"), b"", b'{"kind":"exit","why":"a\\\\b"}')),  # JSON, as it came
        (b"%o1Lo:3/1", None),  # a label and nothing after it
        (b"%o1Lo!x", None),
        (b"%o1L", None),
        (b"n1: plain output", None),
    ],
)  # fmt: skip
def test_parse_wire_reads_the_header_and_unescapes_the_body(line, parsed) -> None:
    assert parse_wire(line) == parsed


def test_invalid_utf8_text_is_reversible() -> None:
    record = decode_wire(frame_all("out", [b"ok \xff\xfe\\x41 done\n"])[0])
    assert record is not None
    assert record.data == b"ok \xff\xfe\\x41 done"


def test_logwire_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(logwire.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported, "no imports found: the check itself is broken"
    assert imported <= set(sys.stdlib_module_names)
