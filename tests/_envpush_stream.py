"""Helpers for the node side of `orch env push` on local directories: an environment of a
few files, and the head's stream of some of them (as envpush/relay.py writes it)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from orchestrator.envpush.relay import Stream, write_stream
from orchestrator.remote.envpush_manifest import manifest


def head_stream(head_root: Path, rels: list[str]) -> tuple[io.BytesIO, str]:
    """The head's stream of `rels` out of `head_root`, and its manifest's sha256."""
    found = manifest(str(head_root))
    stream = Stream(str(head_root), found, tuple(rels))
    data, out = stream.manifest_bytes(), io.BytesIO()
    write_stream(stream, data, out)
    out.seek(0)
    return out, hashlib.sha256(data).hexdigest()


def environment(root: Path, files: dict[str, str]) -> Path:
    """`root` with each of `files` (relative path -> text) written in it."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root
