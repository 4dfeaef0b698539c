"""The stage step of the checkpoint program on a node, in process: a whole checkpoint is
staged from what the node has, its copies and other nodes (threads on loopback), and swapped
in whole."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from _checkpoint_node import (
    HOP,
    JOB,
    OTHER_HOP,
    Talking,
    copies_of,
    every_file,
    send_files,
    sha,
    tree,
)

from orchestrator.remote.checkpoint_stage import stage
from orchestrator.remote.envpush_relay import Hop

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
    tree(copies_of(node_root) / "global_step10" / writer, files)
    manifest = {"files": [{"path": p, "size": len(d), "sha256": sha(d)}
                          for p, d in listed.items()]}  # fmt: skip
    (copies_of(node_root) / "global_step10" / f"{writer}.json").write_text(json.dumps(manifest))


def _stage_request(top: Path, node_root: Path) -> dict[str, Any]:
    return {"dir": str(top), "job_id": JOB, "node_root": str(node_root), "node": "n0",
            "entry": "global_step10", "kind": "dir", "free_margin": 0,
            "files": [{"path": p, "size": len(d), "sha256": sha(d)} for p, d in WHOLE.items()],
            "write": {"latest": "global_step10"}}  # fmt: skip


def _staging_node(tmp_path: Path) -> tuple[Path, Path]:
    top, node_root = tmp_path / "n0" / "ckpt", tmp_path / "n0-orch"
    corrupt = bytearray(WHOLE[NAMES[1]])
    corrupt[0] ^= 1
    tree(top, {NAMES[0]: WHOLE[NAMES[0]], NAMES[1]: bytes(corrupt),
               "global_step10/stale.pt": b"from an attempt that died",
               "latest": b"global_step5"})  # fmt: skip
    _keep_copy(node_root, "n1", {NAMES[1 + 1]: WHOLE[NAMES[2]], NAMES[3]: b"rotten" * 100},
               {NAMES[2]: WHOLE[NAMES[2]], NAMES[3]: WHOLE[NAMES[3]]})  # fmt: skip
    return top, node_root


def _senders(tmp_path: Path) -> tuple[Path, Path]:
    one, two = tmp_path / "n1" / "ckpt", tmp_path / "n3" / "ckpt"
    tree(one, {NAMES[1]: WHOLE[NAMES[1]], NAMES[2 + 1]: WHOLE[NAMES[3]]})
    tree(two, {NAMES[4]: WHOLE[NAMES[4]]})
    return one, two


def _send_in_background(top: Path, root: Path, port: int, paths: list[str],
                        hop: Hop) -> threading.Thread:  # fmt: skip
    thread = threading.Thread(target=send_files, args=(top, root, port, paths, hop), daemon=True)
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
    assert every_file(top) == {**WHOLE, "latest": b"global_step10"}
    assert [p.name for p in top.iterdir() if p.name.startswith(".")] == []


def test_stage_with_everything_here_needs_no_sender(tmp_path: Path) -> None:
    top, node_root = tmp_path / "ckpt", tmp_path / "orch"
    tree(top, {**WHOLE, "global_step10/stale.pt": b"old"})

    staging = Talking(stage, _stage_request(top, node_root))
    answer = staging.answer()

    assert staging.next_line() == {"missing": [], "have": 5, "local": 0}
    assert answer == {"ok": True, "received": 0, "reused": 5, "received_bytes": 0,
                      "set_aside": []}  # fmt: skip
    assert every_file(top) == {**WHOLE, "latest": b"global_step10"}


def test_stage_moves_newer_entries_that_are_not_whole_out_of_sight_and_keeps_them(
    tmp_path: Path,
) -> None:
    top, node_root = tmp_path / "ckpt", tmp_path / "orch"
    tree(top, {**WHOLE, "global_step20/zero_pp_rank_2.pt": b"only this node's shard"})

    answer = Talking(stage, {**_stage_request(top, node_root),
                             "set_aside": ["global_step20", "global_step30"]}).answer()

    assert answer["set_aside"] == ["global_step20"]  # global_step30 is not on this node
    assert not (top / "global_step20").exists()
    kept = top / ".orch-set-aside" / "global_step20" / "zero_pp_rank_2.pt"
    assert kept.read_bytes() == b"only this node's shard"
    assert every_file(top)["latest"] == b"global_step10"


def test_a_single_file_checkpoint_is_staged_from_a_kept_copy(tmp_path: Path) -> None:
    top, node_root = tmp_path / "ckpt", tmp_path / "orch"
    weights = b"weights of step 20"
    tree(top, {"model.safetensors": b"weights of step 10"})
    tree(copies_of(node_root) / "model.safetensors" / "n1", {"model.safetensors": weights})
    manifest = {"files": [{"path": "model.safetensors", "size": len(weights),
                           "sha256": sha(weights)}]}  # fmt: skip
    (copies_of(node_root) / "model.safetensors" / "n1.json").write_text(json.dumps(manifest))
    request = {**_stage_request(top, node_root), "entry": "model.safetensors", "kind": "file",
               "files": manifest["files"], "write": {}}  # fmt: skip

    staging = Talking(stage, request)
    answer = staging.answer()

    assert staging.next_line() == {"missing": [], "have": 0, "local": 1}
    assert answer["ok"] and answer["reused"] == 1
    assert every_file(top) == {"model.safetensors": weights}


def test_stage_leaves_the_old_entry_when_a_sender_brings_the_wrong_file(tmp_path: Path) -> None:
    top, node_root = _staging_node(tmp_path)
    before = every_file(top)
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
    assert every_file(top) == before  # the old entry and the old pointer, as they were


def test_stage_refuses_a_path_outside_its_entry(tmp_path: Path) -> None:
    request = _stage_request(tmp_path / "ckpt", tmp_path / "orch")
    request["files"][0]["path"] = "other_step/model.pt"

    answer = Talking(stage, request).answer()

    assert not answer["ok"] and "other_step/model.pt is not a file of the dir" in answer["error"]
