"""The send and receive steps of the checkpoint program on a node, in process (the two nodes
of a copy are two threads on loopback): a part sent to another node lands there whole or not
at all."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _checkpoint_node import (
    HOP,
    PART,
    copies_of,
    every_file,
    receive_part,
    send_files,
    sha,
    tree,
)

from orchestrator.remote import envpush_relay


def test_a_part_sent_to_another_node_lands_whole_with_its_manifest(tmp_path: Path) -> None:
    writer_top, receiver_root = tmp_path / "n1" / "ckpt", tmp_path / "n2-orch"
    tree(writer_top, PART)

    receiving = receive_part(receiver_root, PART)
    ready = receiving.next_line()
    receiving.tell({"hop": HOP.to_dict()})
    sent = send_files(writer_top, tmp_path / "n1-orch", ready["port"], sorted(PART))
    answer = receiving.answer()

    assert ready["ready"] is True and sent["ok"] and sent["changed"] == []
    assert sent["sha256"] == {path: sha(data) for path, data in PART.items()}
    assert answer == {"ok": True, "bytes": sum(map(len, PART.values())), "files": 2}
    part = copies_of(receiver_root) / "global_step10"
    assert every_file(part / "n1") == PART
    manifest = json.loads((part / "n1.json").read_text())
    assert manifest["files"] == [{"path": p, "size": len(d), "sha256": sha(d)}
                                 for p, d in sorted(PART.items())]  # fmt: skip
    assert sorted(p.name for p in copies_of(receiver_root).iterdir()) == ["global_step10"]
    assert (copies_of(receiver_root) / "global_step10" / "n1").stat().st_mode & 0o777 == 0o700


def test_a_newer_copy_of_a_part_replaces_the_older_whole(tmp_path: Path) -> None:
    writer_top, receiver_root = tmp_path / "n1" / "ckpt", tmp_path / "n2-orch"
    tree(writer_top, PART)
    for files in (PART, {"global_step10/mp_rank_00_model_states.pt": b"newer"}):
        tree(writer_top, files)
        receiving = receive_part(receiver_root, files)
        port = receiving.next_line()["port"]
        receiving.tell({"hop": HOP.to_dict()})
        send_files(writer_top, tmp_path / "n1-orch", port, sorted(files))
        assert receiving.answer()["ok"]

    part = copies_of(receiver_root) / "global_step10"
    assert every_file(part / "n1") == {"global_step10/mp_rank_00_model_states.pt": b"newer"}


def test_a_copy_kept_here_is_sent_on_to_another_node(tmp_path: Path) -> None:
    keeper_root, receiver_root = tmp_path / "n2-orch", tmp_path / "n3-orch"
    tree(copies_of(keeper_root) / "global_step10" / "n1", PART)

    receiving = receive_part(receiver_root, PART)
    port = receiving.next_line()["port"]
    receiving.tell({"hop": HOP.to_dict()})
    sent = send_files(tmp_path / "n2" / "ckpt", keeper_root, port, sorted(PART), source="copy")

    assert sent["ok"] and receiving.answer()["ok"]
    assert every_file(copies_of(receiver_root) / "global_step10" / "n1") == PART


def test_a_receiver_that_is_not_there_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree(tmp_path / "ckpt", PART)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(envpush_relay, "CONNECT_S", 0.0)  # no retries while it starts

    answer = send_files(tmp_path / "ckpt", tmp_path / "orch", port, sorted(PART))

    assert not answer["ok"] and f"127.0.0.1:{port}" in answer["error"]
    assert "cannot reach the receiving node" in answer["error"]


def test_a_file_changed_while_sent_leaves_nothing_on_the_receiver(tmp_path: Path) -> None:
    writer_top, receiver_root = tmp_path / "n1" / "ckpt", tmp_path / "n2-orch"
    files = {"global_step10/big.pt": b"\0" * (3 << 20)}
    tree(writer_top, files)

    receiving = receive_part(receiver_root, files)
    port = receiving.next_line()["port"]
    receiving.tell({"hop": HOP.to_dict()})

    def save_again() -> None:  # the job writes the file again while it is sent
        time.sleep(0.2)
        with (writer_top / "global_step10" / "big.pt").open("r+b") as handle:
            handle.write(b"new")

    saver = threading.Thread(target=save_again)
    saver.start()
    sent = send_files(writer_top, tmp_path / "n1-orch", port, sorted(files), bandwidth=4 << 20)
    saver.join()
    answer = receiving.answer()

    assert not sent["ok"] and sent["changed"] == ["global_step10/big.pt"]
    assert "changed while sent" in sent["error"]
    assert not answer["ok"] and answer["changed"] == ["global_step10/big.pt"]
    assert "on n2:" in answer["error"] and "nothing of it is kept" in answer["error"]
    assert list(copies_of(receiver_root).iterdir()) == []


def test_a_file_the_receiver_did_not_list_is_refused(tmp_path: Path) -> None:
    writer_top, receiver_root = tmp_path / "n1" / "ckpt", tmp_path / "n2-orch"
    tree(writer_top, {**PART, "global_step10/extra.pt": b"extra"})

    receiving = receive_part(receiver_root, PART)
    port = receiving.next_line()["port"]
    receiving.tell({"hop": HOP.to_dict()})
    send_files(writer_top, tmp_path / "n1-orch", port, ["global_step10/extra.pt", *sorted(PART)])
    answer = receiving.answer()

    assert not answer["ok"] and "global_step10/extra.pt, which was not asked for" in answer["error"]
    assert list(copies_of(receiver_root).iterdir()) == []


@pytest.mark.parametrize("path", ["../escaped", "/tmp/escaped", "global_step10/../../escaped"])
def test_a_path_outside_the_copy_is_refused_by_the_receiver(tmp_path: Path, path: str) -> None:
    receiver_root = tmp_path / "n2-orch"
    receiving = receive_part(receiver_root, {"global_step10/x.pt": b"x"})
    port = receiving.next_line()["port"]
    receiving.tell({"hop": HOP.to_dict()})
    _raw_sender(port, [{"path": path, "size": 1}], b"x")
    answer = receiving.answer()

    assert not answer["ok"] and "not allowed" in answer["error"]
    assert not any(p.name == "escaped" for p in tmp_path.rglob("*"))


def test_a_path_outside_the_checkpoint_directory_is_neither_sent_nor_awaited(
    tmp_path: Path,
) -> None:
    sent = send_files(tmp_path / "ckpt", tmp_path / "orch", 1, ["../secret"])
    awaited = receive_part(tmp_path / "n2-orch", {"/etc/cron.d/x": b"x"}).answer()

    assert not sent["ok"] and "'../secret'" in sent["error"]
    assert not awaited["ok"] and "'/etc/cron.d/x'" in awaited["error"]


def _raw_sender(port: int, headers: list[dict[str, Any]], body: bytes) -> None:
    """A sender that presents the link's secret, then says what it likes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(HOP.sender.encode())
        assert conn.recv(len(HOP.receiver)) == HOP.receiver.encode()
        for header in headers:
            conn.sendall(json.dumps(header).encode() + b"\n" + body)
        conn.sendall(b'{"end": true, "sha256": {}, "changed": []}\n')


def test_too_little_free_space_is_refused_with_the_numbers(tmp_path: Path) -> None:
    receiver_root = tmp_path / "n2-orch"
    margin = 1 << 60

    answer = receive_part(receiver_root, PART, margin=margin).answer()

    assert not answer["ok"] and f"{copies_of(receiver_root)} has " in answer["error"]
    assert f"needs {sum(map(len, PART.values()))} bytes with {margin} left free" in answer["error"]
    assert "free space there" in answer["error"]
