"""The scan and prune steps of the checkpoint program on a node, in process: what a scan
lists of the checkpoint directory and of the copies kept; copies no longer needed are
removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _checkpoint_node import JOB, PART, copies_of, sha, tree

from orchestrator.remote.checkpoint_scan import prune, scan


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    return tmp_path / "orch-node"



# ----- scan ---------------------------------------------------------------------------------
def test_a_scan_lists_entries_their_files_and_deepspeeds_pointer(
    tmp_path: Path, node_root: Path
) -> None:
    top = tmp_path / "ckpt"
    tree(top, {**PART, "latest": b"global_step10", "model.safetensors": b"w" * 7,
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
    assert answer["copies_dir"] == str(copies_of(node_root)) and answer["copies"] == []
    assert answer["free_bytes"] > 0 and answer["marker_seen"] is None
    assert answer["truncated"] is False


def test_a_scan_gives_the_sha256_of_the_entries_asked_only(tmp_path: Path,
                                                         node_root: Path) -> None:  # fmt: skip
    top = tmp_path / "ckpt"
    tree(top, {"final.pt": b"weights", "step-1/shard.pt": b"shard", "step-2/shard.pt": b"x"})
    answer = scan({"dir": str(top), "job_id": JOB, "node": "n1", "node_root": str(node_root),
                   "hash": ["final.pt", "step-1"]})  # fmt: skip
    hashes = {f["path"]: f.get("sha256") for e in answer["entries"] for f in e["files"]}
    assert hashes == {"final.pt": sha(b"weights"), "step-1/shard.pt": sha(b"shard"),
                      "step-2/shard.pt": None}  # fmt: skip


def test_a_scan_lists_only_the_copies_that_are_whole(tmp_path: Path, node_root: Path) -> None:
    copies = copies_of(node_root)
    tree(copies / "global_step10" / "n1", PART)
    manifest = {"files": [{"path": p, "size": len(d), "sha256": sha(d)} for p, d in PART.items()]}
    (copies / "global_step10" / "n1.json").write_text(json.dumps(manifest))
    tree(copies / "global_step10" / "n3", PART)  # still arriving: no manifest yet

    answer = scan({"dir": str(tmp_path / "ckpt"), "job_id": JOB, "node": "n2",
                   "node_root": str(node_root)})  # fmt: skip

    assert answer["ok"] and not answer["exists"] and answer["entries"] == []
    assert answer["copies"] == [{"entry": "global_step10", "writer": "n1",
                                 "files": manifest["files"]}]  # fmt: skip


def test_a_checkpoint_directory_that_is_a_link_is_refused(tmp_path: Path,
                                                          node_root: Path) -> None:  # fmt: skip
    tree(tmp_path / "real", PART)
    (tmp_path / "ckpt").symlink_to(tmp_path / "real")

    answer = scan({"dir": str(tmp_path / "ckpt"), "job_id": JOB, "node": "n1",
                   "node_root": str(node_root)})  # fmt: skip

    assert answer["ok"] and answer["entries"] == []
    assert f"{tmp_path / 'ckpt'} (owner" in answer["problem"]
    assert "symbolic link" in answer["problem"] and "--checkpoint-dir" in answer["problem"]


def test_a_checkpoint_directory_that_is_a_dangling_link_is_refused_as_a_link(
    tmp_path: Path, node_root: Path
) -> None:
    (tmp_path / "ckpt").symlink_to(tmp_path / "gone")

    answer = scan({"dir": str(tmp_path / "ckpt"), "job_id": JOB, "node": "n1",
                   "node_root": str(node_root)})  # fmt: skip

    assert answer["ok"] and answer["entries"] == [] and answer["free_bytes"] > 0
    assert "symbolic link (to " in answer["problem"] and "--checkpoint-dir" in answer["problem"]


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
    tree(top, {f"step/{n}.pt": b"x" for n in range(5)})

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



# ----- prune --------------------------------------------------------------------------------
def test_prune_removes_the_copies_not_kept_then_the_jobs_copies(tmp_path: Path) -> None:
    node_root = tmp_path / "orch"
    for entry in ("global_step5", "global_step10", "global_step15"):
        tree(copies_of(node_root) / entry / "n1", {f"{entry}/model.pt": b"m"})
    request = {"job_id": JOB, "node_root": str(node_root)}

    kept = prune({**request, "keep": ["global_step15"], "drop": False})
    dropped = prune({**request, "keep": None, "drop": True})
    again = prune({**request, "keep": None, "drop": True})

    assert kept == {"ok": True, "removed": ["global_step10", "global_step5"]}
    assert dropped == {"ok": True, "removed": ["global_step15"]}
    assert again == {"ok": True, "removed": []}
    assert not copies_of(node_root).exists() and (node_root / "checkpoints").is_dir()
