"""A file's sha256, read a chunk at a time: the one way orch hashes a file, on a node (the
probe's check of the job's script, env push's manifests) and on the head (outputs collected
from the nodes, the pre-flight's script). STANDARD LIBRARY ONLY, shipped beside the node
programs that use it (as orch_digest).
"""

from __future__ import annotations

import hashlib
import os

CHUNK = 1 << 20  # read at a time: a file of any size hashes in constant memory


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of the file at `path`; OSError when it cannot be read."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
