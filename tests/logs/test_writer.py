"""One node's head-side log file (logs/writer.py): the wire records of its ranks in, the
lines a terminal would have kept out, each stamped and tagged."""

from __future__ import annotations

import itertools
from pathlib import Path

from _logmodel import expected_log, read_log
from _pdsh_output import pdsh_output
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.logs.router import LogRouter
from orchestrator.logs.writer import NodeLogWriter, strip_terminal_codes
from orchestrator.records.job import log_file_name
from orchestrator.remote.logwire import WireFramer


def one_stream_log(tmp_path: Path, chunks: list[bytes], stream: str = "out") -> list:
    writer = NodeLogWriter(tmp_path / "n.log", frame_sample_interval=None)
    router = LogRouter(tmp_path, writer_factory=lambda _path: writer)
    router.feed(pdsh_output("n1", [(stream, c) for c in chunks]))
    router.close()
    tag = stream.encode()
    return [text for t, text in read_log(tmp_path / "n.log") if t == tag]


ALPHABET = [b"a", b"b9", b" ", b"\r", b"\n", b"\r\n", "é".encode(), b"\xff", b"\\", b"\x00"]


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.sampled_from(ALPHABET), max_size=60),
    st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_any_stream_in_any_chunking_gives_the_terminal_view(
    tmp_path_factory, parts: list[bytes], cuts: list[int]
) -> None:
    raw = b"".join(parts)
    points = sorted({c % (len(raw) + 1) for c in cuts})
    edges = [0, *points, len(raw)]
    chunks = [raw[a:b] for a, b in itertools.pairwise(edges)]
    got = one_stream_log(tmp_path_factory.mktemp("p"), chunks)
    assert got == expected_log(raw)


def test_long_line_invalid_utf8_and_no_final_newline_are_kept(tmp_path: Path) -> None:
    big = b"x" * (1 << 20)
    chunks = [b"a\xffb\n", big[:300_000], big[300_000:] + b"\n", b"tail without newline"]
    assert one_stream_log(tmp_path, chunks) == [b"a\xffb", big, b"tail without newline"]


def test_over_long_line_is_written_in_tagged_pieces(tmp_path: Path) -> None:
    writer = NodeLogWriter(tmp_path / "n.log", max_line_bytes=100_000)
    router = LogRouter(tmp_path, writer_factory=lambda _path: writer)
    line = bytes(b"0123456789"[i % 10] for i in range(350_000))
    router.feed(pdsh_output("n1", [("out", line + b"\nnext\n")]))
    router.close()
    entries = read_log(tmp_path / "n.log")
    pieces = [(t, x) for t, x in entries if t in (b"out", b"out+")]
    assert b"".join(x for _, x in pieces[:-1]) == line
    assert [t for t, _ in pieces] == [b"out", b"out+", b"out+", b"out+", b"out"]
    assert pieces[-1] == (b"out", b"next")


def test_escape_codes_are_removed(tmp_path: Path) -> None:
    chunks = [b"\x1b[1;31mred\x1b[0m plain \x1b]0;title\x07end\x1b(B\n"]
    assert one_stream_log(tmp_path, chunks, "err") == [b"red plain end"]


def test_long_bar_is_sampled_and_final_frame_kept(tmp_path: Path) -> None:
    now = [1000.0]
    writer = NodeLogWriter(tmp_path / "n.log", frame_sample_interval=30, clock=lambda: now[0])
    for step in range(1, 101):
        now[0] += 1.0
        writer.write_wire(ord("F"), ord("e"), b"%d/100" % step)
    writer.close()
    # first frame at t=1001, then one sample per 30 s, then the final frame at close
    assert [t for _, t in read_log(tmp_path / "n.log")] == [
        b"31/100",
        b"61/100",
        b"91/100",
        b"100/100",
    ]


def test_strip_terminal_codes_leaves_what_was_shown_last() -> None:
    assert strip_terminal_codes(b"10%\r50%\r   \r") == b"50%"
    assert strip_terminal_codes(b"\x1b[32mok\x1b[0m") == b"ok"


def test_log_file_name_is_safe() -> None:
    assert log_file_name("node1") == "node1.log"
    assert log_file_name("../etc/x") == ".._etc_x.log"
    assert "/" not in log_file_name("a/b")


def test_memory_stays_bounded_for_a_huge_line(tmp_path: Path) -> None:
    writer = NodeLogWriter(tmp_path / "n.log", max_line_bytes=1 << 20)
    framer = WireFramer("out")
    block = b"y" * 65536
    held = 0
    for _ in range(160):  # 10 MiB in one line, never terminated
        for wire in framer.feed(block):
            writer.write_wire(wire[3], wire[4], wire[6:-1])
        state = writer._streams[(b"", ord("o"))]
        held = max(held, state.chunks_len + len(framer._buf))
    for wire in framer.flush():
        writer.write_wire(wire[3], wire[4], wire[6:-1])
    writer.close()
    assert held <= (1 << 20) + 65536
    assert (tmp_path / "n.log").read_bytes().count(b"y") == 160 * 65536
