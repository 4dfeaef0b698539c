"""`orch env push`'s stream through a node: only the previous node, presenting its link's
secret, gets the port's place, whatever other users of the node connect meanwhile; the
stream goes on only to the node that answers the link's other secret; the node keeps its own
files (each as the head's manifest says) and passes every byte on, and a lost next node
stops only the passing on."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from _envpush_stream import environment, head_stream

from orchestrator.envpush.relay import Stream, write_stream
from orchestrator.remote.envpush_manifest import manifest, pack
from orchestrator.remote.envpush_relay import (
    Hop,
    NotTheNextNode,
    Relay,
    accept_upstream,
    connect_downstream,
    open_port,
)
from orchestrator.remote.envpush_staging import receive

HOP = Hop("0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210")


def _accept_in_background(
    server: socket.socket, seconds: float, hop: Hop = HOP
) -> dict[str, object]:
    found: dict[str, object] = {}

    def accept() -> None:
        try:
            found["conn"] = accept_upstream(server, hop, time.monotonic() + seconds,
                                            threading.Event())  # fmt: skip
        except (OSError, EOFError) as err:
            found["error"] = err

    found["thread"] = thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return found


def test_callers_that_say_nothing_or_something_else_do_not_keep_the_previous_node_out() -> None:
    server = open_port()
    port = server.getsockname()[1]
    # Another user of the node got there first: 20 connections that say nothing (each
    # allowed 5 s to say the secret), and one that says something else.
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    wrong = socket.create_connection(("127.0.0.1", port))
    wrong.sendall(b"f" * len(HOP.sender))
    found = _accept_in_background(server, seconds=4.0)
    upstream = connect_downstream("127.0.0.1", port, HOP)
    found["thread"].join(10.0)  # type: ignore[attr-defined]
    assert "error" not in found, found.get("error")
    conn = found["conn"]
    assert isinstance(conn, socket.socket)
    upstream.sendall(b"the stream")
    assert conn.recv(64) == b"the stream"
    # None of the others was given the stream, or the answer: each is closed.
    wrong.settimeout(5.0)
    assert wrong.recv(1) == b""
    for other in silent:
        other.settimeout(5.0)
        assert other.recv(1) == b""
    for sock in (conn, upstream, wrong, server, *silent):
        sock.close()


def test_without_the_previous_node_the_port_gives_up_at_its_deadline() -> None:
    server = open_port()
    port = server.getsockname()[1]
    wrong = socket.create_connection(("127.0.0.1", port))
    wrong.sendall(b"0" * len(HOP.sender))
    found = _accept_in_background(server, seconds=1.0)
    found["thread"].join(10.0)  # type: ignore[attr-defined]
    assert isinstance(found.get("error"), TimeoutError)
    assert "conn" not in found
    wrong.close()
    server.close()


def test_whoever_takes_a_port_once_its_node_ended_hears_nothing_and_feeds_no_one() -> None:
    """The chain a -> b -> c: b's receive ended early and another user bound its port. a
    hears from them no answer to its link's secret and sends them nothing of the stream;
    the secret they heard from a is not the one c wants, so c still takes the stream from
    the real b (each link has its own secrets)."""
    a_to_b, b_to_c = Hop.new(), Hop.new()
    impostor = socket.create_server(("127.0.0.1", 0))  # on the port b opened
    heard: dict[str, bytes] = {}

    def take_bs_place() -> None:
        conn, _ = impostor.accept()
        conn.settimeout(10.0)
        heard["secret"] = conn.recv(len(a_to_b.sender))
        conn.sendall(b"0" * len(a_to_b.receiver))  # it cannot know b's answer
        heard["after"] = _read_all(conn)

    thread = threading.Thread(target=take_bs_place, daemon=True)
    thread.start()
    with pytest.raises(NotTheNextNode, match="did not answer as the next node"):
        connect_downstream("127.0.0.1", impostor.getsockname()[1], a_to_b)
    thread.join(10.0)
    assert heard == {"secret": a_to_b.sender.encode(), "after": b""}  # nothing of the stream

    server = open_port()
    port = server.getsockname()[1]
    found = _accept_in_background(server, seconds=4.0, hop=b_to_c)
    replayed = socket.create_connection(("127.0.0.1", port))
    replayed.sendall(heard["secret"])
    replayed.settimeout(5.0)
    assert replayed.recv(64) == b""  # closed, unanswered
    real_b = connect_downstream("127.0.0.1", port, b_to_c)
    found["thread"].join(10.0)  # type: ignore[attr-defined]
    assert "error" not in found, found.get("error")
    real_b.sendall(b"the stream")
    assert found["conn"].recv(64) == b"the stream"  # type: ignore[attr-defined]
    for sock in (real_b, replayed, server, impostor, found["conn"]):
        sock.close()  # type: ignore[attr-defined]


def test_a_link_whose_target_is_not_the_heads_is_refused(tmp_path: Path) -> None:
    """The manifest is checked by the sha256 the head sent on its own channel; the stream
    only through it: a link that points elsewhere than the manifest says is refused, and
    the node keeps what it had."""
    head = environment(tmp_path / "head", {"a.py": "a\n"})
    (head / "current").symlink_to("a.py")
    forged = environment(tmp_path / "forged", {"a.py": "a\n"})
    (forged / "current").symlink_to("/etc/passwd")
    found = manifest(str(head))
    data, out = pack(found).encode(), io.BytesIO()
    write_stream(Stream(str(forged), found, ("a.py", "current")), data, out)
    root = environment(tmp_path / "node" / "env", {"old.py": "old\n"})
    out.seek(0)
    answer = receive(str(root), hashlib.sha256(data).hexdigest(), out)
    assert answer["ok"] is False
    assert "current: a link to '/etc/passwd' in the stream, to 'a.py' in the head's" in (
        answer["error"])
    assert sorted(os.listdir(root)) == ["old.py"]
    assert sorted(os.listdir(root.parent)) == ["env"]  # nothing half-built left


@pytest.mark.process
def test_a_node_keeps_its_own_files_and_passes_every_byte_on(tmp_path: Path) -> None:
    """Two nodes that need different files get one stream: the first keeps what it lacks,
    skips the rest, and passes the whole stream on, byte for byte."""
    head = environment(tmp_path / "head", {"a.py": "a\n", "b.py": "b\n"})
    first = environment(tmp_path / "n1" / "env", {"a.py": "a\n"})  # lacks b.py
    stream, sha = head_stream(head, ["a.py", "b.py"])  # the second node lacks both
    left, right = socket.socketpair()
    relay = Relay(stream.read, left)
    passed = io.BytesIO()
    reader = threading.Thread(target=lambda: passed.write(_read_all(right)))
    reader.start()
    answer = receive(str(first), sha, relay)
    relay.drain()
    relay.drop()
    reader.join(10)
    assert answer["ok"] is True and answer["received"] == 1  # b.py only
    assert (first / "b.py").read_text() == "b\n"
    assert passed.getvalue() == stream.getvalue() and relay.forward_error is None
    second = tmp_path / "n2" / "env"
    passed.seek(0)
    assert receive(str(second), sha, passed)["received"] == 2
    assert sorted(p.name for p in second.iterdir()) == [".orch-manifest.json", "a.py", "b.py"]


@pytest.mark.process
def test_a_lost_next_node_stops_the_passing_on_not_the_build(tmp_path: Path) -> None:
    head = environment(tmp_path / "head", {"a.py": "a\n" * 400_000})
    stream, sha = head_stream(head, ["a.py"])
    left, right = socket.socketpair()
    right.close()  # the next node is gone
    relay = Relay(stream.read, left)
    answer = receive(str(tmp_path / "env"), sha, relay)
    assert answer["ok"] is True and relay.forward_error is not None
    assert "passing the stream on failed" in relay.forward_error


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)
