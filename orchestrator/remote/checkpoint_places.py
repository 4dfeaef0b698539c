"""Where the checkpoint program keeps things on a node, and what it calls them: the job's
copies in orch's own directory there (never in the job's checkpoint directory, PATH), the
names it gives its own files, each part's manifest, and the room a copy needs.

<user directory>/checkpoints/<job>/<entry>/<writer>/<path as under PATH>, and
<entry>/<writer>.json ({"files": [{"path", "size", "sha256"}]}) once that part is whole.
STANDARD LIBRARY ONLY, shipped beside remote/checkpoint_node.py (as orch_checkpoint_places).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
from dataclasses import dataclass
from typing import Any

try:  # on a node, loaded beside the program
    import orch_checkpoint_step as steps
    import orch_checkpoint_stream as stream
    import orch_filesystem as filesystem
    import orch_owned as owned
except ImportError:
    from orchestrator.remote import checkpoint_step as steps
    from orchestrator.remote import checkpoint_stream as stream
    from orchestrator.remote import filesystem, owned

COPIES_DIR = "checkpoints"  # in the user's directory for orch: one directory per job
OWN_PREFIX = ".orch-"  # orch's names in PATH and in the copies: never listed as checkpoints
STAGE_PREFIX = OWN_PREFIX + "stage-"
PART_PREFIX = OWN_PREFIX + "part-"
OLD_PREFIX = OWN_PREFIX + "old-"
MANIFEST_SUFFIX = ".json"
ASIDE_DIR = OWN_PREFIX + "set-aside"  # in PATH: newer entries a restart could not make whole


# ----- places ------------------------------------------------------------------------------
def copies_dir(request: steps.Request) -> str:
    """The job's copies on this node, each level made under umask 077 and checked."""
    job = stream.one_name(request["job_id"], "job id")
    root = str(request.get("node_root") or "")
    return owned.user_directories(os.getuid(), [COPIES_DIR, job], root)


def existing_copies_dir(request: steps.Request) -> str | None:
    """The job's copies on this node when there are any (None), each level checked."""
    job = stream.one_name(request["job_id"], "job id")
    uid = os.getuid()
    choice = owned.choose_directory(uid, str(request.get("node_root") or ""))
    if choice.refused is not None:
        raise owned.UnsafeDirectory(choice.refused)
    path = choice.path
    for level in (path, os.path.join(path, COPIES_DIR), os.path.join(path, COPIES_DIR, job)):
        try:
            problem = owned.not_own_directory(level, os.lstat(level), uid)
        except FileNotFoundError:
            return None
        if problem is not None:
            raise owned.UnsafeDirectory(problem)
        path = level
    return path


def check_room(where: str, need: int, margin: int, what: str) -> None:
    """StepError with the numbers when `where` has not `need` bytes free and `margin` left."""
    free = filesystem.free_bytes(where)
    if free < need + margin:
        raise steps.StepError(
            f"{where} has {free} bytes free; {what} needs {need} bytes with {margin} left free: "
            "free space there, or set ORCH_NODE_ROOT (copies) or --checkpoint-dir to a "
            "filesystem with room")  # fmt: skip


def checkpoint_dir_problem(path: str, uid: int) -> str | None:
    """Why PATH is no checkpoint directory of the user's to use: a link, not a directory, or
    another user's (its owner and mode named, with the fix); None when it is (or is not
    there yet)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    said = f"{path} (owner {owned.owner_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})"
    if stat.S_ISLNK(st.st_mode):
        return (f"{said} is a symbolic link (to {os.readlink(path)}): give --checkpoint-dir "
                "the directory itself")  # fmt: skip
    if not stat.S_ISDIR(st.st_mode):
        return f"{said} is not a directory: move it away or choose another --checkpoint-dir"
    if st.st_uid != uid:
        return (f"{said} belongs to another user, not to {owned.owner_name(uid)}: choose a "
                "--checkpoint-dir of your own")  # fmt: skip
    return None


# ----- names -------------------------------------------------------------------------------
def own_name(name: object, what: str) -> str:
    """A marker's name: one name of orch's own (.orch-*), never one of the job's files."""
    checked = stream.one_name(name, what)
    if not checked.startswith(OWN_PREFIX):
        raise stream.UnsafePath(f"{what} {checked!r}, not a name of orch's own ({OWN_PREFIX}*)")
    return checked


def entry_name(name: object) -> str:
    """A checkpoint entry's name: one name directly under PATH, never one of orch's own."""
    entry = stream.one_name(name, "checkpoint entry")
    if entry.startswith(OWN_PREFIX):
        raise stream.UnsafePath(f"checkpoint entry {entry!r}, a name of orch's own")
    return entry


def writer_name(name: object) -> str:
    """A writer node's name, as its part's directory and manifest are named in the copies."""
    writer = stream.one_name(name, "writer node")
    if writer.startswith(".") or writer.endswith(MANIFEST_SUFFIX):
        raise stream.UnsafePath(f"writer node {writer!r}, which the copies cannot name")
    return writer


# ----- parts and their manifests -----------------------------------------------------------
def _read_manifest(path: str) -> list[dict[str, Any]] | None:
    """A part's files as its manifest lists them; None when it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            files = json.load(handle)["files"]
        return [{"path": stream.relative_path(item["path"]), "size": int(item["size"]),
                 "sha256": str(item["sha256"])} for item in files]  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Part:
    """One writer's part of an entry, whole, as kept here: its files and where they are."""

    entry: str
    writer: str
    files: tuple[dict[str, Any], ...]
    top: str  # <copies>/<entry>/<writer>: its files' paths are relative to it


def whole_parts(copies: str, entry: str | None = None) -> list[Part]:
    """The parts kept here (of `entry`, or of every entry) that have their manifest."""
    names = [entry] if entry is not None else sorted(os.listdir(copies))
    parts = []
    for name in names:
        entry_dir = os.path.join(copies, name)
        if name.startswith(".") or not os.path.isdir(entry_dir) or os.path.islink(entry_dir):
            continue
        for item in sorted(os.listdir(entry_dir)):
            writer = item.removesuffix(MANIFEST_SUFFIX)
            top = os.path.join(entry_dir, writer)
            if writer == item or item.startswith(".") or not os.path.isdir(top):
                continue
            files = _read_manifest(os.path.join(entry_dir, item))
            if files is not None:
                parts.append(Part(name, writer, tuple(files), top))
    return parts


def _write_manifest(entry_dir: str, writer: str, got: stream.Received) -> None:
    files = [{"path": path, "size": digest.size, "sha256": digest.sha256}
             for path, digest in sorted(got.files.items())]  # fmt: skip
    part = os.path.join(entry_dir, f".{writer}{MANIFEST_SUFFIX}.new")
    owned.write_private_file(part, json.dumps({"files": files}).encode())
    os.replace(part, os.path.join(entry_dir, writer + MANIFEST_SUFFIX))


def remove(path: str) -> None:
    """`path` gone, whatever it is; a link is removed, never followed."""
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def place_part(copies: str, entry: str, writer: str, received: str,
               got: stream.Received) -> None:  # fmt: skip
    """The part received whole (in `received`, a directory in `copies`) put in place of any
    older copy of it, then its manifest: it is listed only once whole, never mixed."""
    entry_dir = os.path.join(copies, entry)
    owned.private_directory(entry_dir, os.getuid())
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(entry_dir, writer + MANIFEST_SUFFIX))
    target = os.path.join(entry_dir, writer)
    aside = None
    if os.path.lexists(target):
        aside = os.path.join(copies, OLD_PREFIX + secrets.token_hex(8))
        os.rename(target, aside)
    os.rename(received, target)
    _write_manifest(entry_dir, writer, got)
    if aside is not None:
        remove(aside)
