"""The checkpoint program on a node, each step run in process (the two nodes of a copy are
two threads on loopback): what a scan lists of the checkpoint directory and of the copies
kept; a part sent to another node lands there whole or not at all; a whole checkpoint is
staged from what the node has, its copies and other nodes, and swapped in whole; copies no
longer needed are removed."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _shipped import not_loaded_before

from orchestrator.remote import boot_blob, boot_code, envpush_relay
from orchestrator.remote.checkpoint_node import (
    CHECKPOINT_PARTS,
    main,
    prune,
    receive,
    scan,
    send,
    stage,
)
from orchestrator.remote.envpush_relay import Hop

HOP = Hop("0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210")
OTHER_HOP = Hop("00112233445566778899aabbccddeeff", "ffeeddccbbaa99887766554433221100")
JOB = "job-7"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(top: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        (top / path).parent.mkdir(parents=True, exist_ok=True)
        (top / path).write_bytes(data)


def _every_file(top: Path) -> dict[str, bytes]:
    return {p.relative_to(top).as_posix(): p.read_bytes()
            for p in sorted(top.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    return tmp_path / "orch-node"


def _copies(node_root: Path) -> Path:
    return node_root / "checkpoints" / JOB


class Talking:
    """A step that talks in lines (receive, stage), run in a thread as its node would run
    it: the lines it said, the lines told to it, its answer."""

    def __init__(self, step: Callable[..., dict[str, Any]], request: dict[str, Any]) -> None:
        self.said: queue.Queue[dict[str, Any]] = queue.Queue()
        self._told: queue.Queue[str] = queue.Queue()
        self._answer: dict[str, Any] = {}

        def run() -> None:
            self._answer.update(step(request, self._told.get, self.said.put))

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def next_line(self) -> dict[str, Any]:
        return self.said.get(timeout=30)

    def tell(self, doc: dict[str, Any]) -> None:
        self._told.put(json.dumps(doc) + "\n")

    def answer(self) -> dict[str, Any]:
        self._thread.join(60)
        assert not self._thread.is_alive()
        return self._answer


def _send(top: Path, node_root: Path, port: int, paths: list[str], hop: Hop = HOP,
          bandwidth: int = 0, source: str = "dir", entry: str = "global_step10",
          writer: str = "n1") -> dict[str, Any]:  # fmt: skip
    request = {"dir": str(top), "job_id": JOB, "node_root": str(node_root), "entry": entry,
               "writer": writer, "files": [{"path": path, "from": source} for path in paths],
               "host": "127.0.0.1", "port": port, "hop": hop.to_dict(),
               "bandwidth": bandwidth}  # fmt: skip
    return send(request, lower=lambda: False)  # the test's own priority stays as it is


def _receive(node_root: Path, files: dict[str, bytes], margin: int = 0) -> Talking:
    listed = [{"path": path, "size": len(data)} for path, data in files.items()]
    request = {"job_id": JOB, "node_root": str(node_root), "entry": "global_step10",
               "writer": "n1", "node": "n2", "free_margin": margin, "files": listed}  # fmt: skip
    return Talking(receive, request)


PART = {"global_step10/mp_rank_00_model_states.pt": os.urandom(1 << 20),
        "global_step10/zero_pp_rank_0_optim_states.pt": b"optim" * 1000}  # fmt: skip


# ----- scan ---------------------------------------------------------------------------------
def test_a_scan_lists_entries_their_files_and_deepspeeds_pointer(
    tmp_path: Path, node_root: Path
) -> None:
    top = tmp_path / "ckpt"
    _tree(top, {**PART, "latest": b"global_step10", "model.safetensors": b"w" * 7,
                "checkpoint-5/trainer_state.json": b"{}",
                "checkpoint-5/latest": b"tag5"})  # fmt: skip
    (tmp_path / "outside").mkdir()
    (top / "linked").symlink_to(tmp_path / "outside")
    (top / "global_step10" / "a_link.pt").symlink_to(top / "model.safetensors")
    (top / ".orch-stage-123").mkdir()

    answer = scan({"dir": str(top), "job_id": JOB, "node": "n1", "node_root": str(node_root)})

    assert answer["ok"] and answer["problem"] is None and answer["is_dir"] and answer["writable"]
    entries = {entry["name"]: entry for entry in answer["entries"]}
    assert sorted(entries) == ["checkpoint-5", "global_step10", "latest", "model.safetensors"]
    step = entries["global_step10"]
    assert step["kind"] == "dir" and step["text"] == {}
    assert [(f["path"], f["size"]) for f in step["files"]] == sorted(
        (path, len(data)) for path, data in PART.items())
    assert all(isinstance(f["mtime_ns"], int) for f in step["files"])
    assert entries["latest"]["kind"] == "file"
    assert entries["latest"]["text"] == {"latest": "global_step10"}
    assert entries["checkpoint-5"]["text"] == {"checkpoint-5/latest": "tag5"}
    assert entries["model.safetensors"]["files"][0]["path"] == "model.safetensors"
    assert answer["copies_dir"] == str(_copies(node_root)) and answer["copies"] == []
    assert answer["free_bytes"] > 0 and answer["marker_seen"] is None
    assert answer["truncated"] is False


def test_a_scan_lists_only_the_copies_that_are_whole(tmp_path: Path, node_root: Path) -> None:
    copies = _copies(node_root)
    _tree(copies / "global_step10" / "n1", PART)
    manifest = {"files": [{"path": p, "size": len(d), "sha256": _sha(d)} for p, d in PART.items()]}
    (copies / "global_step10" / "n1.json").write_text(json.dumps(manifest))
    _tree(copies / "global_step10" / "n3", PART)  # still arriving: no manifest yet

    answer = scan({"dir": str(tmp_path / "ckpt"), "job_id": JOB, "node": "n2",
                   "node_root": str(node_root)})  # fmt: skip

    assert answer["ok"] and not answer["exists"] and answer["entries"] == []
    assert answer["copies"] == [{"entry": "global_step10", "writer": "n1",
                                 "files": manifest["files"]}]  # fmt: skip


def test_a_checkpoint_directory_that_is_a_link_is_refused(tmp_path: Path,
                                                          node_root: Path) -> None:  # fmt: skip
    _tree(tmp_path / "real", PART)
    (tmp_path / "ckpt").symlink_to(tmp_path / "real")

    answer = scan({"dir": str(tmp_path / "ckpt"), "job_id": JOB, "node": "n1",
                   "node_root": str(node_root)})  # fmt: skip

    assert answer["ok"] and answer["entries"] == []
    assert f"{tmp_path / 'ckpt'} (owner" in answer["problem"]
    assert "symbolic link" in answer["problem"] and "--checkpoint-dir" in answer["problem"]


def test_a_scan_makes_the_directory_and_finds_a_shared_filesystem_by_its_marker(
    tmp_path: Path, node_root: Path
) -> None:
    top = tmp_path / "ckpt"
    base = {"dir": str(top), "job_id": JOB, "node_root": str(node_root)}

    first = scan({**base, "node": "n1", "create": True, "write_marker": ".orch-shared-1"})
    other = scan({**base, "node": "n2", "marker": ".orch-shared-1"})
    gone = scan({**base, "node": "n1", "remove_marker": ".orch-shared-1",
                 "marker": ".orch-shared-1"})  # fmt: skip
    theirs = scan({**base, "node": "n1", "write_marker": "model.pt"})

    assert first["ok"] and top.is_dir() and first["entries"] == []  # orch's marker unlisted
    assert other["marker_seen"] is True and gone["marker_seen"] is False
    assert not theirs["ok"] and "on n1:" in theirs["error"] and "model.pt" in theirs["error"]
    assert not (top / "model.pt").exists()


def test_a_scan_says_when_it_listed_only_part_of_the_files(tmp_path: Path,
                                                           node_root: Path) -> None:  # fmt: skip
    top = tmp_path / "ckpt"
    _tree(top, {f"step/{n}.pt": b"x" for n in range(5)})

    answer = scan({"dir": str(top), "job_id": JOB, "node": "n1", "node_root": str(node_root)},
                  max_files=3)  # fmt: skip

    assert answer["truncated"] is True and len(answer["entries"][0]["files"]) == 3


def test_copies_refuse_a_node_root_that_is_another_place_through_a_link(
    tmp_path: Path,
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "root").symlink_to(tmp_path / "real")

    answer = scan({"dir": str(tmp_path / "ckpt"), "job_id": JOB, "node": "n1",
                   "node_root": str(tmp_path / "root")})  # fmt: skip

    assert not answer["ok"] and "symbolic link" in answer["error"]
    assert str(tmp_path / "root") in answer["error"] and "ORCH_NODE_ROOT" in answer["error"]
    assert list((tmp_path / "real").iterdir()) == []


# ----- send and receive -----------------------------------------------------------------------
def test_a_part_sent_to_another_node_lands_whole_with_its_manifest(tmp_path: Path) -> None:
    writer_top, receiver_root = tmp_path / "n1" / "ckpt", tmp_path / "n2-orch"
    _tree(writer_top, PART)

    receiving = _receive(receiver_root, PART)
    ready = receiving.next_line()
    receiving.tell({"hop": HOP.to_dict()})
    sent = _send(writer_top, tmp_path / "n1-orch", ready["port"], sorted(PART))
    answer = receiving.answer()

    assert ready["ready"] is True and sent["ok"] and sent["changed"] == []
    assert sent["sha256"] == {path: _sha(data) for path, data in PART.items()}
    assert answer == {"ok": True, "bytes": sum(map(len, PART.values())), "files": 2}
    part = _copies(receiver_root) / "global_step10"
    assert _every_file(part / "n1") == PART
    manifest = json.loads((part / "n1.json").read_text())
    assert manifest["files"] == [{"path": p, "size": len(d), "sha256": _sha(d)}
                                 for p, d in sorted(PART.items())]  # fmt: skip
    assert sorted(p.name for p in _copies(receiver_root).iterdir()) == ["global_step10"]
    assert (_copies(receiver_root) / "global_step10" / "n1").stat().st_mode & 0o777 == 0o700


def test_a_newer_copy_of_a_part_replaces_the_older_whole(tmp_path: Path) -> None:
    writer_top, receiver_root = tmp_path / "n1" / "ckpt", tmp_path / "n2-orch"
    _tree(writer_top, PART)
    for files in (PART, {"global_step10/mp_rank_00_model_states.pt": b"newer"}):
        _tree(writer_top, files)
        receiving = _receive(receiver_root, files)
        port = receiving.next_line()["port"]
        receiving.tell({"hop": HOP.to_dict()})
        _send(writer_top, tmp_path / "n1-orch", port, sorted(files))
        assert receiving.answer()["ok"]

    part = _copies(receiver_root) / "global_step10"
    assert _every_file(part / "n1") == {"global_step10/mp_rank_00_model_states.pt": b"newer"}


def test_a_copy_kept_here_is_sent_on_to_another_node(tmp_path: Path) -> None:
    keeper_root, receiver_root = tmp_path / "n2-orch", tmp_path / "n3-orch"
    _tree(_copies(keeper_root) / "global_step10" / "n1", PART)

    receiving = _receive(receiver_root, PART)
    port = receiving.next_line()["port"]
    receiving.tell({"hop": HOP.to_dict()})
    sent = _send(tmp_path / "n2" / "ckpt", keeper_root, port, sorted(PART), source="copy")

    assert sent["ok"] and receiving.answer()["ok"]
    assert _every_file(_copies(receiver_root) / "global_step10" / "n1") == PART


def test_a_receiver_that_is_not_there_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path / "ckpt", PART)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(envpush_relay, "CONNECT_S", 0.0)  # no retries while it starts

    answer = _send(tmp_path / "ckpt", tmp_path / "orch", port, sorted(PART))

    assert not answer["ok"] and f"127.0.0.1:{port}" in answer["error"]
    assert "cannot reach the receiving node" in answer["error"]


def test_a_file_changed_while_sent_leaves_nothing_on_the_receiver(tmp_path: Path) -> None:
    writer_top, receiver_root = tmp_path / "n1" / "ckpt", tmp_path / "n2-orch"
    files = {"global_step10/big.pt": b"\0" * (3 << 20)}
    _tree(writer_top, files)

    receiving = _receive(receiver_root, files)
    port = receiving.next_line()["port"]
    receiving.tell({"hop": HOP.to_dict()})

    def save_again() -> None:  # the job writes the file again while it is sent
        time.sleep(0.2)
        with (writer_top / "global_step10" / "big.pt").open("r+b") as handle:
            handle.write(b"new")

    saver = threading.Thread(target=save_again)
    saver.start()
    sent = _send(writer_top, tmp_path / "n1-orch", port, sorted(files), bandwidth=4 << 20)
    saver.join()
    answer = receiving.answer()

    assert not sent["ok"] and sent["changed"] == ["global_step10/big.pt"]
    assert "changed while sent" in sent["error"]
    assert not answer["ok"] and answer["changed"] == ["global_step10/big.pt"]
    assert "on n2:" in answer["error"] and "nothing of it is kept" in answer["error"]
    assert list(_copies(receiver_root).iterdir()) == []


def test_a_file_the_receiver_did_not_list_is_refused(tmp_path: Path) -> None:
    writer_top, receiver_root = tmp_path / "n1" / "ckpt", tmp_path / "n2-orch"
    _tree(writer_top, {**PART, "global_step10/extra.pt": b"extra"})

    receiving = _receive(receiver_root, PART)
    port = receiving.next_line()["port"]
    receiving.tell({"hop": HOP.to_dict()})
    _send(writer_top, tmp_path / "n1-orch", port, ["global_step10/extra.pt", *sorted(PART)])
    answer = receiving.answer()

    assert not answer["ok"] and "global_step10/extra.pt, which was not asked for" in answer["error"]
    assert list(_copies(receiver_root).iterdir()) == []


@pytest.mark.parametrize("path", ["../escaped", "/tmp/escaped", "global_step10/../../escaped"])
def test_a_path_outside_the_copy_is_refused_by_the_receiver(tmp_path: Path, path: str) -> None:
    receiver_root = tmp_path / "n2-orch"
    receiving = _receive(receiver_root, {"global_step10/x.pt": b"x"})
    port = receiving.next_line()["port"]
    receiving.tell({"hop": HOP.to_dict()})
    _raw_sender(port, [{"path": path, "size": 1}], b"x")
    answer = receiving.answer()

    assert not answer["ok"] and "not allowed" in answer["error"]
    assert not any(p.name == "escaped" for p in tmp_path.rglob("*"))


def test_a_path_outside_the_checkpoint_directory_is_neither_sent_nor_awaited(
    tmp_path: Path,
) -> None:
    sent = _send(tmp_path / "ckpt", tmp_path / "orch", 1, ["../secret"])
    awaited = _receive(tmp_path / "n2-orch", {"/etc/cron.d/x": b"x"}).answer()

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

    answer = _receive(receiver_root, PART, margin=margin).answer()

    assert not answer["ok"] and f"{_copies(receiver_root)} has " in answer["error"]
    assert f"needs {sum(map(len, PART.values()))} bytes with {margin} left free" in answer["error"]
    assert "free space there" in answer["error"]


# ----- stage ----------------------------------------------------------------------------------
WHOLE = {
    "global_step10/mp_rank_00_model_states.pt": b"model 0" * 100,  # here, whole
    "global_step10/zero_pp_rank_0_optim_states.pt": b"optim 0" * 100,  # here, but corrupt
    "global_step10/zero_pp_rank_1_optim_states.pt": b"optim 1" * 100,  # a good copy here
    "global_step10/zero_pp_rank_2_optim_states.pt": b"optim 2" * 100,  # a corrupt copy here
    "global_step10/zero_pp_rank_3_optim_states.pt": b"optim 3" * 100,  # only on another node
}
NAMES = sorted(WHOLE)


def _keep_copy(node_root: Path, writer: str, files: dict[str, bytes],
               listed: dict[str, bytes]) -> None:  # fmt: skip
    """A part kept on this node: `files` on disk, `listed` in its manifest."""
    _tree(_copies(node_root) / "global_step10" / writer, files)
    manifest = {"files": [{"path": p, "size": len(d), "sha256": _sha(d)}
                          for p, d in listed.items()]}  # fmt: skip
    (_copies(node_root) / "global_step10" / f"{writer}.json").write_text(json.dumps(manifest))


def _stage_request(top: Path, node_root: Path) -> dict[str, Any]:
    return {"dir": str(top), "job_id": JOB, "node_root": str(node_root), "node": "n0",
            "entry": "global_step10", "kind": "dir", "free_margin": 0,
            "files": [{"path": p, "size": len(d), "sha256": _sha(d)} for p, d in WHOLE.items()],
            "write": {"latest": "global_step10"}}  # fmt: skip


def _staging_node(tmp_path: Path) -> tuple[Path, Path]:
    top, node_root = tmp_path / "n0" / "ckpt", tmp_path / "n0-orch"
    corrupt = bytearray(WHOLE[NAMES[1]])
    corrupt[0] ^= 1
    _tree(top, {NAMES[0]: WHOLE[NAMES[0]], NAMES[1]: bytes(corrupt),
                "global_step10/stale.pt": b"from an attempt that died",
                "latest": b"global_step5"})  # fmt: skip
    _keep_copy(node_root, "n1", {NAMES[1 + 1]: WHOLE[NAMES[2]], NAMES[3]: b"rotten" * 100},
               {NAMES[2]: WHOLE[NAMES[2]], NAMES[3]: WHOLE[NAMES[3]]})  # fmt: skip
    return top, node_root


def _senders(tmp_path: Path) -> tuple[Path, Path]:
    one, two = tmp_path / "n1" / "ckpt", tmp_path / "n3" / "ckpt"
    _tree(one, {NAMES[1]: WHOLE[NAMES[1]], NAMES[2 + 1]: WHOLE[NAMES[3]]})
    _tree(two, {NAMES[4]: WHOLE[NAMES[4]]})
    return one, two


def _send_in_background(top: Path, root: Path, port: int, paths: list[str],
                        hop: Hop) -> threading.Thread:  # fmt: skip
    thread = threading.Thread(target=_send, args=(top, root, port, paths, hop), daemon=True)
    thread.start()
    return thread


def test_stage_puts_the_whole_checkpoint_in_place_from_here_and_two_senders(
    tmp_path: Path,
) -> None:
    top, node_root = _staging_node(tmp_path)
    one, two = _senders(tmp_path)

    staging = Talking(stage, _stage_request(top, node_root))
    sorted_line = staging.next_line()
    ready = staging.next_line()
    staging.tell({"hops": [HOP.to_dict(), OTHER_HOP.to_dict()]})
    senders = [_send_in_background(two, tmp_path / "n3-orch", ready["port"], [NAMES[4]],
                                   OTHER_HOP),
               _send_in_background(one, tmp_path / "n1-orch", ready["port"],
                                   [NAMES[1], NAMES[3]], HOP)]  # fmt: skip
    answer = staging.answer()
    for sender in senders:
        sender.join(30)

    assert sorted_line == {"missing": [NAMES[1], NAMES[3], NAMES[4]], "have": 1, "local": 1}
    assert ready["ready"] is True
    assert answer == {"ok": True, "received": 3, "reused": 2, "set_aside": [],
                      "received_bytes": sum(len(WHOLE[NAMES[n]]) for n in (1, 3, 4))}  # fmt: skip
    assert _every_file(top) == {**WHOLE, "latest": b"global_step10"}
    assert [p.name for p in top.iterdir() if p.name.startswith(".")] == []


def test_stage_with_everything_here_needs_no_sender(tmp_path: Path) -> None:
    top, node_root = tmp_path / "ckpt", tmp_path / "orch"
    _tree(top, {**WHOLE, "global_step10/stale.pt": b"old"})

    staging = Talking(stage, _stage_request(top, node_root))
    answer = staging.answer()

    assert staging.next_line() == {"missing": [], "have": 5, "local": 0}
    assert answer == {"ok": True, "received": 0, "reused": 5, "received_bytes": 0,
                      "set_aside": []}  # fmt: skip
    assert _every_file(top) == {**WHOLE, "latest": b"global_step10"}


def test_stage_moves_newer_entries_that_are_not_whole_out_of_sight_and_keeps_them(
    tmp_path: Path,
) -> None:
    top, node_root = tmp_path / "ckpt", tmp_path / "orch"
    _tree(top, {**WHOLE, "global_step20/zero_pp_rank_2.pt": b"only this node's shard"})

    answer = Talking(stage, {**_stage_request(top, node_root),
                             "set_aside": ["global_step20", "global_step30"]}).answer()

    assert answer["set_aside"] == ["global_step20"]  # global_step30 is not on this node
    assert not (top / "global_step20").exists()
    kept = top / ".orch-set-aside" / "global_step20" / "zero_pp_rank_2.pt"
    assert kept.read_bytes() == b"only this node's shard"
    assert _every_file(top)["latest"] == b"global_step10"


def test_a_single_file_checkpoint_is_staged_from_a_kept_copy(tmp_path: Path) -> None:
    top, node_root = tmp_path / "ckpt", tmp_path / "orch"
    weights = b"weights of step 20"
    _tree(top, {"model.safetensors": b"weights of step 10"})
    _tree(_copies(node_root) / "model.safetensors" / "n1", {"model.safetensors": weights})
    manifest = {"files": [{"path": "model.safetensors", "size": len(weights),
                           "sha256": _sha(weights)}]}  # fmt: skip
    (_copies(node_root) / "model.safetensors" / "n1.json").write_text(json.dumps(manifest))
    request = {**_stage_request(top, node_root), "entry": "model.safetensors", "kind": "file",
               "files": manifest["files"], "write": {}}  # fmt: skip

    staging = Talking(stage, request)
    answer = staging.answer()

    assert staging.next_line() == {"missing": [], "have": 0, "local": 1}
    assert answer["ok"] and answer["reused"] == 1
    assert _every_file(top) == {"model.safetensors": weights}


def test_stage_leaves_the_old_entry_when_a_sender_brings_the_wrong_file(tmp_path: Path) -> None:
    top, node_root = _staging_node(tmp_path)
    before = _every_file(top)
    one, two = _senders(tmp_path)
    (two / NAMES[4]).write_bytes(b"optim 9" * 100)  # same size, another checkpoint's

    staging = Talking(stage, _stage_request(top, node_root))
    staging.next_line()
    port = staging.next_line()["port"]
    staging.tell({"hops": [HOP.to_dict(), OTHER_HOP.to_dict()]})
    senders = [_send_in_background(one, tmp_path / "n1-orch", port, [NAMES[1], NAMES[3]], HOP),
               _send_in_background(two, tmp_path / "n3-orch", port, [NAMES[4]], OTHER_HOP)]
    answer = staging.answer()
    for sender in senders:
        sender.join(30)

    assert not answer["ok"] and f"{NAMES[4]} arrived with sha256" in answer["error"]
    assert "on n0:" in answer["error"]
    assert _every_file(top) == before  # the old entry and the old pointer, as they were


def test_stage_refuses_a_path_outside_its_entry(tmp_path: Path) -> None:
    request = _stage_request(tmp_path / "ckpt", tmp_path / "orch")
    request["files"][0]["path"] = "other_step/model.pt"

    answer = Talking(stage, request).answer()

    assert not answer["ok"] and "other_step/model.pt is not a file of the dir" in answer["error"]


# ----- prune --------------------------------------------------------------------------------
def test_prune_removes_the_copies_not_kept_then_the_jobs_copies(tmp_path: Path) -> None:
    node_root = tmp_path / "orch"
    for entry in ("global_step5", "global_step10", "global_step15"):
        _tree(_copies(node_root) / entry / "n1", {f"{entry}/model.pt": b"m"})
    request = {"job_id": JOB, "node_root": str(node_root)}

    kept = prune({**request, "keep": ["global_step15"], "drop": False})
    dropped = prune({**request, "keep": None, "drop": True})
    again = prune({**request, "keep": None, "drop": True})

    assert kept == {"ok": True, "removed": ["global_step10", "global_step5"]}
    assert dropped == {"ok": True, "removed": ["global_step15"]}
    assert again == {"ok": True, "removed": []}
    assert not _copies(node_root).exists() and (node_root / "checkpoints").is_dir()


# ----- the program ----------------------------------------------------------------------------
def test_every_part_is_shipped_before_what_imports_it() -> None:
    assert not_loaded_before(CHECKPOINT_PARTS, "checkpoint_node") == []


def test_an_unknown_step_is_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["copy"]) == 2
    said = json.loads(capsys.readouterr().out)
    assert not said["ok"] and "unknown step 'copy'" in said["error"]


@pytest.mark.process
def test_the_shipped_program_scans_and_prunes(tmp_path: Path) -> None:
    top, node_root = tmp_path / "ckpt", tmp_path / "orch"
    _tree(top, PART)
    code = boot_code(boot_blob(CHECKPOINT_PARTS, "checkpoint_node"))

    def run(step: str, request: dict[str, Any]) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", code, step], input=json.dumps(request),
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert done.stderr == ""
        return json.loads(done.stdout.splitlines()[-1])

    scanned = run("scan", {"dir": str(top), "job_id": JOB, "node": "n1",
                           "node_root": str(node_root)})  # fmt: skip
    broken = run("scan", {"job_id": JOB})
    pruned = run("prune", {"job_id": JOB, "node_root": str(node_root), "drop": True})

    assert [entry["name"] for entry in scanned["entries"]] == ["global_step10"]
    assert not broken["ok"] and "'dir'" in broken["error"]
    assert pruned == {"ok": True, "removed": []}
