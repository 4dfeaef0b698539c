"""What a node holds for the job, read and trimmed: the scan and prune steps of the
checkpoint program (remote/checkpoint_node.py).

- scan: PATH's entries (each file or directory directly under it) with their files' sizes
  and mtimes (and sha256, for the entries asked: the job's last checkpoints, at its end),
  DeepSpeed's small `latest` pointers' text, the whole copies this node keeps, free space
  on both sides; the shared-filesystem marker written, looked for or removed.
- prune: the copies of entries no longer kept removed, or the job's copies altogether.

STANDARD LIBRARY ONLY, shipped beside the program (as orch_checkpoint_scan).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from typing import Any

try:  # on a node, loaded beside the program
    import orch_checkpoint_places as places
    import orch_checkpoint_step as steps
    import orch_checkpoint_stream as stream
    import orch_filesystem as filesystem
except ImportError:
    from orchestrator.remote import checkpoint_places as places
    from orchestrator.remote import checkpoint_step as steps
    from orchestrator.remote import checkpoint_stream as stream
    from orchestrator.remote import filesystem

MAX_FILES = 200_000  # listed by one scan, at most
POINTER_NAMES = ("latest", "latest_universal")  # DeepSpeed's pointer to its newest tag
POINTER_MAX = 4096  # bytes of a pointer file read as text



# ----- scan --------------------------------------------------------------------------------
class _Budget:
    """Files a scan may still list; whether it ran out."""

    def __init__(self, files: int) -> None:
        self.left, self.truncated = files, False

    def take(self) -> bool:
        if self.left <= 0:
            self.truncated = True
            return False
        self.left -= 1
        return True


def _file_doc(path: str, st: os.stat_result) -> dict[str, Any]:
    # ctime after mtime: the file was renamed (or its mode changed) after its last write.
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def _dir_files(top: str, entry: str, budget: _Budget) -> list[dict[str, Any]]:
    """Every regular file below PATH/<entry>, paths relative to PATH; links never followed."""
    found: list[dict[str, Any]] = []
    pending = [entry]
    while pending:
        relative = pending.pop()
        try:
            items = sorted(os.scandir(os.path.join(top, relative)), key=lambda item: item.name)
        except OSError:
            continue  # removed meanwhile, or unreadable: the writer's, seen at the next scan
        for item in items:
            path = f"{relative}/{item.name}"
            try:
                if item.is_dir(follow_symlinks=False):
                    pending.append(path)
                elif item.is_file(follow_symlinks=False) and budget.take():
                    found.append(_file_doc(path, item.stat(follow_symlinks=False)))
            except OSError:
                continue
    return sorted(found, key=lambda doc: doc["path"])


def _pointer_text(top: str, path: str) -> str | None:
    try:
        fd = stream.open_below(top, path)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size > POINTER_MAX:
            return None
        return os.read(fd, POINTER_MAX).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _entry_doc(top: str, name: str, budget: _Budget) -> dict[str, Any] | None:
    """One entry of PATH as scan lists it; None for a link or anything but a file or a
    directory."""
    try:
        st = os.lstat(os.path.join(top, name))
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode):
        kind, files = "file", ([_file_doc(name, st)] if budget.take() else [])
        pointers = [name] if name in POINTER_NAMES else []
    elif stat.S_ISDIR(st.st_mode):
        kind, files = "dir", _dir_files(top, name, budget)
        pointers = [f"{name}/{pointer}" for pointer in POINTER_NAMES]
    else:
        return None
    text = {path: said for path in pointers if (said := _pointer_text(top, path)) is not None}
    return {"name": name, "kind": kind, "files": files, "text": text}


def _entries(top: str, budget: _Budget, hashed: frozenset[str]) -> list[dict[str, Any]]:
    names = sorted(name for name in os.listdir(top) if not name.startswith(places.OWN_PREFIX))
    found = [doc for name in names if (doc := _entry_doc(top, name, budget)) is not None]
    for doc in found:
        if doc["name"] in hashed:
            _add_hashes(top, doc["files"])
    return found


def _add_hashes(top: str, files: list[dict[str, Any]]) -> None:
    """Each file's sha256, where it is the size the scan listed (else it changed since, and
    no hash is given for it)."""
    for doc in files:
        with contextlib.suppress(OSError):
            size, digest = stream.sha256_of_file(top, doc["path"])
            if size == doc["size"]:
                doc["sha256"] = digest



def _markers(request: steps.Request, top: str, is_dir: bool) -> bool | None:
    """Writes, removes and looks for the shared-filesystem marker as asked; whether the
    marker asked about is seen (None: none asked about)."""
    if request.get("write_marker") and is_dir:
        name = places.own_name(request["write_marker"], "marker")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(os.path.join(top, name), flags, 0o644)
        with os.fdopen(fd, "w") as handle:
            node = steps.node_name(request)
            handle.write(f"orch checkpoint directory marker, written on {node}\n")
    if request.get("remove_marker"):
        name = places.own_name(request["remove_marker"], "marker")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(top, name))
    if not request.get("marker"):
        return None
    return os.path.lexists(os.path.join(top, places.own_name(request["marker"], "marker")))


def _writable(path: str, is_dir: bool) -> bool:
    return os.access(path if is_dir else filesystem.nearest_existing(path), os.W_OK | os.X_OK)


@steps.answering
def scan(request: steps.Request, max_files: int = MAX_FILES) -> steps.Answer:
    """What PATH holds, and the whole copies kept here (see the module's docstring)."""
    top = str(request["dir"])
    if not os.path.isabs(top):
        raise steps.StepError(f"--checkpoint-dir {top!r} is not an absolute path: give one")
    if request.get("create") and not os.path.lexists(top):
        os.makedirs(top, exist_ok=True)
    problem = places.checkpoint_dir_problem(top, os.getuid())
    exists = os.path.lexists(top)
    is_dir = exists and problem is None
    copies = places.copies_dir(request)
    budget = _Budget(max_files)
    answer: steps.Answer = {
        "ok": True, "node": steps.node_name(request), "dir": top, "exists": exists,
        "is_dir": exists and os.path.isdir(top) and not os.path.islink(top),
        "writable": _writable(top, is_dir), "problem": problem,
        "free_bytes": filesystem.free_bytes(top), "copies_dir": copies,
        "copies_free_bytes": filesystem.free_bytes(copies),
        "marker_seen": _markers(request, top, is_dir), "truncated": False,
        "entries": _entries(top, budget, frozenset(request.get("hash") or ())) if is_dir else [],
        "copies": [{"entry": part.entry, "writer": part.writer, "files": list(part.files)}
                   for part in places.whole_parts(copies)],
    }  # fmt: skip
    if budget.truncated:
        answer["truncated"] = True
    return answer


# ----- prune ---------------------------------------------------------------------------------
def _remove_entry_copies(entry_dir: str) -> None:
    """The manifests first (no part is listed as whole meanwhile), then everything."""
    for name in os.listdir(entry_dir):
        if name.endswith(places.MANIFEST_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(entry_dir, name))
    shutil.rmtree(entry_dir)


@steps.answering
def prune(request: steps.Request) -> steps.Answer:
    """The copies of every entry not in `keep` (null: none kept) removed, or with `drop` the
    job's whole copies directory."""
    copies = places.existing_copies_dir(request)
    if copies is None:
        return {"ok": True, "removed": []}
    entries = sorted(name for name in os.listdir(copies) if not name.startswith("."))
    if request.get("drop"):
        shutil.rmtree(copies)
        return {"ok": True, "removed": entries}
    keep = set(request.get("keep") or ())
    removed = [name for name in entries if name not in keep]
    for name in removed:
        path = os.path.join(copies, name)
        if os.path.islink(path) or not os.path.isdir(path):
            places.remove(path)
        else:
            _remove_entry_copies(path)
    return {"ok": True, "removed": removed}
