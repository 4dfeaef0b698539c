"""Nodes' scans of a checkpoint directory as a node sends them (JSON documents), read
through NodeScan.from_dict like the head reads them: entries, DeepSpeed pointers, copies."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from orchestrator.checkpoints.model import NodeScan

PATH = "/scratch/ckpt"
COPIES_DIR = "/var/tmp/orch/checkpoint-copies"
PLENTY = 1 << 50


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def dir_entry(name: str, files: Mapping[str, int], mtime: int = 1,
              text: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A directory under PATH: {path inside it: size}, every file modified at `mtime`."""
    return {
        "name": name,
        "kind": "dir",
        "files": [{"path": f"{name}/{relative}", "size": size, "mtime_ns": mtime}
                  for relative, size in files.items()],
        "text": {f"{name}/{relative}": content for relative, content in (text or {}).items()},
    }


def file_entry(name: str, size: int, mtime: int = 1, ctime: int | None = None) -> dict[str, Any]:
    """A file under PATH; `ctime` after `mtime`: renamed into place after its last write."""
    seen = {"path": name, "size": size, "mtime_ns": mtime, "ctime_ns": mtime if ctime is None
            else ctime}  # fmt: skip
    return {"name": name, "kind": "file", "files": [seen], "text": {}}


def pointer(target: str, name: str = "latest", mtime: int = 1) -> dict[str, Any]:
    """DeepSpeed's pointer file at PATH's top, naming a tag directory."""
    entry = file_entry(name, len(target), mtime)
    entry["text"] = {name: target}
    return entry


def copy_doc(entry: str, writer: str, files: Mapping[str, int], tag: str = "") -> dict[str, Any]:
    """A whole copy of `writer`'s part of `entry`; the hashes follow the path, size and tag
    (another tag: another content)."""
    return {
        "entry": entry,
        "writer": writer,
        "files": [{"path": f"{entry}/{relative}", "size": size,
                   "sha256": sha(f"{entry}/{relative}:{size}{tag}")}
                  for relative, size in files.items()],
    }


def scan_doc(node: str, *entries: dict[str, Any], copies: tuple[dict[str, Any], ...] = (),
             copies_free: int | None = PLENTY, truncated: bool = False,
             problem: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "ok": True, "node": node, "dir": PATH, "exists": True, "is_dir": True,
        "writable": True, "problem": problem, "free_bytes": PLENTY, "copies_dir": COPIES_DIR,
        "copies_free_bytes": copies_free, "marker_seen": None, "truncated": truncated,
        "entries": list(entries), "copies": list(copies),
    }  # fmt: skip


def scan(node: str, *entries: dict[str, Any], **facts: Any) -> NodeScan:
    return NodeScan.from_dict(scan_doc(node, *entries, **facts))


def scans(*found: NodeScan) -> dict[str, NodeScan]:
    return {one.node: one for one in found}
