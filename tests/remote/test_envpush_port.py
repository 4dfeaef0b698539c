"""The port a node opens for `orch env push`'s stream: only the previous node, presenting the
push's token, gets the stream's place, whatever other users of the node connect meanwhile."""

from __future__ import annotations

import socket
import threading
import time

from orchestrator.remote.envpush import accept_upstream, connect_downstream, open_port

TOKEN = "0123456789abcdef0123456789abcdef"


def _accept_in_background(server: socket.socket, seconds: float) -> dict[str, object]:
    found: dict[str, object] = {}

    def accept() -> None:
        try:
            found["conn"] = accept_upstream(server, TOKEN, time.monotonic() + seconds,
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
    # allowed 5 s to say the token), and one that says something else.
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    wrong = socket.create_connection(("127.0.0.1", port))
    wrong.sendall(b"f" * len(TOKEN))
    found = _accept_in_background(server, seconds=4.0)
    upstream = connect_downstream({"host": "127.0.0.1", "port": port}, TOKEN)
    found["thread"].join(10.0)  # type: ignore[attr-defined]
    assert "error" not in found, found.get("error")
    conn = found["conn"]
    assert isinstance(conn, socket.socket)
    upstream.sendall(b"the stream")
    assert conn.recv(64) == b"the stream"
    # None of the others was given the stream: each is closed.
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
    wrong.sendall(b"0" * len(TOKEN))
    found = _accept_in_background(server, seconds=1.0)
    found["thread"].join(10.0)  # type: ignore[attr-defined]
    assert isinstance(found.get("error"), TimeoutError)
    assert "conn" not in found
    wrong.close()
    server.close()
