"""`orch env push`'s manifests: what an environment holds (relative path -> [kind, size,
sha256 or link target, mode]), what a node lacks of the head's (the delta), and the record
of the last push a node keeps in its root so that its next look hashes only what changed.
The head plans with these, each node builds with them. STANDARD LIBRARY ONLY, shipped beside
remote/envpush.py (as orch_envpush_manifest).
"""

from __future__ import annotations

import base64
import json
import os
import stat
import zlib
from typing import Any

try:  # on a node, loaded beside the program
    import orch_digest as digest
except ImportError:
    from orchestrator.remote import digest

MANIFEST_NAME = ".orch-manifest.json"  # kept in the root: the last push's, with mtimes
STREAM_MANIFEST = ".orch-push-manifest"  # the stream's first member: the head's manifest
MARKER_PREFIX = ".orch-push-marker-"  # a push's shared-filesystem check: not the environment's
SKIPPED_DIRS = ("__pycache__",)


def pack(doc: Any) -> str:
    """`doc` as compact JSON, compressed, base64: a manifest on one line."""
    text = json.dumps(doc, separators=(",", ":"))
    return base64.b64encode(zlib.compress(text.encode(), 6)).decode()


def unpack(text: str) -> Any:
    return json.loads(zlib.decompress(base64.b64decode(text)))


def manifest(root: str, previous: dict[str, list[Any]] | None = None) -> dict[str, list[Any]]:
    """relative path -> ["d", 0, "", mode] | ["l", 0, target, 0] | ["f", size, sha, mode];
    `previous` (path -> [kind, size, sha, mode, mtime_ns]) spares hashing unchanged files."""
    previous = previous or {}
    found = {}
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        rel_top = os.path.relpath(top, root)
        for name in dirs + sorted(files):
            rel = name if rel_top == "." else rel_top + "/" + name
            if rel == MANIFEST_NAME or name.endswith(".pyc") or name.startswith(MARKER_PREFIX):
                continue
            found[rel] = _entry(os.path.join(top, name), previous.get(rel))
    return found


def _entry(path: str, before: list[Any] | None) -> list[Any]:
    info = os.lstat(path)
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return ["l", 0, os.readlink(path), 0]
    if stat.S_ISDIR(info.st_mode):
        return ["d", 0, "", mode]
    if before and before[1] == info.st_size and before[4:5] == [info.st_mtime_ns]:
        return ["f", info.st_size, before[2], mode]
    return ["f", info.st_size, digest.sha256_of(path), mode]


def delta(head: dict[str, list[Any]], node: dict[str, list[Any]]) -> dict[str, Any]:
    """What makes the node's manifest the head's: "send" (files and links that differ or are
    missing), "remove" (what the head has not), "dirs" (directories the node lacks) and
    "bytes" (the size of what is sent). The head plans with it, each node builds with it."""
    send = {rel: e for rel, e in head.items() if e[0] != "d" and node.get(rel) != e}
    dirs = {
        rel: e[3] for rel, e in head.items() if e[0] == "d" and (node.get(rel) or [""])[0] != "d"
    }
    remove = sorted(rel for rel in node if rel not in head)
    return {"send": send, "remove": remove, "dirs": dirs,
            "bytes": sum(e[1] for e in send.values())}  # fmt: skip


def with_mtimes(root: str, found: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The files of a manifest with their mtimes: what `manifest(root, previous)` needs to
    hash only the files that changed since."""
    return {
        rel: [*entry[:4], os.lstat(os.path.join(root, rel)).st_mtime_ns]
        for rel, entry in found.items()
        if entry[0] == "f"
    }


def recorded(root: str) -> dict[str, list[Any]]:
    """The manifest (with mtimes) the last push left in `root`; empty when there is none."""
    try:
        with open(os.path.join(root, MANIFEST_NAME)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def record(root: str, found: dict[str, list[Any]]) -> None:
    """Leave `found`, every file of which is now in `root`, there with mtimes, so the next
    look hashes only what changed."""
    with open(os.path.join(root, MANIFEST_NAME), "w") as handle:
        json.dump(with_mtimes(root, found), handle, separators=(",", ":"))
