"""`orch env push`'s manifests: what an environment holds (relative path -> [kind, size,
sha256 or link target, mode], the root itself as "."), what a node lacks of the head's (the
delta), the head's bytecode of the files it sends, the mode a node gives each directory, and
the record of the last push a node keeps
in its root so that its next look hashes only what changed (trusted only when it and the
root are the user's own). The head plans with these, each node builds with them. STANDARD
LIBRARY ONLY, shipped beside remote/envpush.py (as orch_envpush_manifest).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import stat
import zlib
from collections.abc import Callable, Iterable
from typing import Any

try:  # on a node, loaded beside the program
    import orch_digest as digest
    import orch_owned as owned
except ImportError:
    from orchestrator.remote import digest, owned

ROOT = "."  # the root's own entry: its mode travels with the rest
MANIFEST_NAME = ".orch-manifest.json"  # kept in the root: the last push's, with mtimes
STREAM_MANIFEST = ".orch-push-manifest"  # the stream's first member: the head's manifest
MARKER_PREFIX = ".orch-push-marker-"  # a push's shared-filesystem check: not the environment's
# In the stream's manifest only: the head's bytecode of the files sent (relative path ->
# [size, sha256]), not part of the environment (its fingerprint and records leave it out).
STREAM_CACHES = ".orch-push-caches"
CACHE_DIR = "__pycache__"
SKIPPED_DIRS = (CACHE_DIR,)
# Every directory a node builds keeps u+rwx, so that the next push can build and remove it;
# its root is writable by the user alone (a root others can write is refused).
OWNER_BITS = 0o700
ROOT_NOT_WRITABLE = stat.S_IWGRP | stat.S_IWOTH


def pack(doc: Any) -> str:
    """`doc` as compact JSON, compressed, base64: a manifest on one line."""
    text = json.dumps(doc, separators=(",", ":"))
    return base64.b64encode(zlib.compress(text.encode(), 6)).decode()


def unpack(text: str) -> Any:
    return json.loads(zlib.decompress(base64.b64decode(text)))


def manifest(
    root: str,
    previous: dict[str, list[Any]] | None = None,
    *,
    owner: int | None = None,
    stats: dict[str, os.stat_result] | None = None,
    check: Callable[[], None] | None = None,
) -> dict[str, list[Any]]:
    """relative path -> ["d", 0, "", mode] | ["l", 0, target, 0] | ["f", size, sha, mode],
    the root as ROOT. `previous` (path -> [kind, size, sha, mode, mtime_ns, inode]) spares
    hashing unchanged files. With `owner`, a file someone else owns gets no hash (a node
    never keeps it: it is sent). `stats` receives each file's lstat from before its hash;
    `check` is called for every entry (it raises to stop the walk)."""
    previous = previous or {}
    found = {ROOT: ["d", 0, "", stat.S_IMODE(os.stat(root).st_mode)]}  # a link to it: its target
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        rel_top = os.path.relpath(top, root)
        for name in dirs + sorted(files):
            rel = name if rel_top == "." else rel_top + "/" + name
            if rel == MANIFEST_NAME or name.endswith(".pyc") or name.startswith(MARKER_PREFIX):
                continue
            if check is not None:
                check()
            found[rel] = _entry(os.path.join(top, name), previous.get(rel), owner, stats, rel)
    return found


def cache_source(rel: str) -> str | None:
    """The source file whose bytecode `rel` is (`d/__pycache__/m.cpython-311.pyc` -> `d/m.py`,
    any interpreter's tag), or None when `rel` is no bytecode cache."""
    directory, _, name = rel.rpartition("/")
    top, _, last = directory.rpartition("/")
    stem, dot, _tag = name.partition(".")
    if last != CACHE_DIR or not name.endswith(".pyc") or not stem or not dot:
        return None
    return f"{top}/{stem}.py" if top else f"{stem}.py"


def caches_of(root: str, sources: Iterable[str]) -> dict[str, list[Any]]:
    """The bytecode `root` holds of `sources` (relative paths; the .py files count), for
    any interpreter: relative path -> [size, sha256], regular files only. Sent with the
    files, it spares each node compiling them again in every process that imports them
    wherever bytecode is not written (PYTHONDONTWRITEBYTECODE, a read-only environment)."""
    wanted = {rel for rel in sources if rel.endswith(".py")}
    found: dict[str, list[Any]] = {}
    for directory in sorted({_cache_dir(rel) for rel in wanted}):
        try:
            names = sorted(os.listdir(os.path.join(root, directory)))
        except OSError:
            continue  # none: the node compiles them
        for name in names:
            rel = f"{directory}/{name}"
            if cache_source(rel) not in wanted:
                continue
            path = os.path.join(root, rel)
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode):
                    found[rel] = [info.st_size, digest.sha256_of(path)]
    return found


def _cache_dir(source: str) -> str:
    top = source.rpartition("/")[0]
    return f"{top}/{CACHE_DIR}" if top else CACHE_DIR


def take_caches(head: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The head's bytecode listed in the stream's manifest, taken out of it (what is left
    is the environment's manifest)."""
    entry = head.pop(STREAM_CACHES, None)
    if not entry or entry[0] != "c" or not isinstance(entry[2], dict):
        return {}
    return entry[2]


def _entry(
    path: str,
    before: list[Any] | None,
    owner: int | None,
    stats: dict[str, os.stat_result] | None,
    rel: str,
) -> list[Any]:
    info = os.lstat(path)
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return ["l", 0, os.readlink(path), 0]
    if stat.S_ISDIR(info.st_mode):
        return ["d", 0, "", mode]
    if stats is not None:
        stats[rel] = info
    if owner is not None and info.st_uid != owner:
        return ["f", info.st_size, "", mode]  # another user's: never kept, whatever it holds
    if before and before[1] == info.st_size and before[4:6] == _when(info):
        return ["f", info.st_size, before[2], mode]
    return ["f", info.st_size, digest.sha256_of(path), mode]


def _when(info: os.stat_result) -> list[int]:
    """What the record keeps of a file besides its hash: a file written (mtime) or replaced
    (inode) since is read again."""
    return [info.st_mtime_ns, info.st_ino]


def built_mode(rel: str, mode: int) -> int:
    """The mode a node gives the head's directory `rel` (of mode `mode`)."""
    if rel == ROOT:
        return (mode | OWNER_BITS) & ~ROOT_NOT_WRITABLE
    return mode | OWNER_BITS


def delta(head: dict[str, list[Any]], node: dict[str, list[Any]]) -> dict[str, Any]:
    """What makes the node's manifest the head's: "send" (files and links that differ or are
    missing), "remove" (what the head has not), "dirs" (directories the node lacks, or has
    with another mode than it would give them) and "bytes" (the size of what is sent). The
    head plans with it, each node builds with it."""
    send = {rel: e for rel, e in head.items() if e[0] != "d" and node.get(rel) != e}
    dirs = {
        rel: e[3]
        for rel, e in head.items()
        if e[0] == "d" and node.get(rel) != ["d", 0, "", built_mode(rel, e[3])]
    }
    remove = sorted(rel for rel in node if rel not in head)
    return {"send": send, "remove": remove, "dirs": dirs,
            "bytes": sum(e[1] for e in send.values())}  # fmt: skip


def with_mtimes(
    root: str, found: dict[str, list[Any]], stats: dict[str, os.stat_result] | None = None
) -> dict[str, list[Any]]:
    """The files of a manifest with their mtimes and inodes (from `stats` where it has the
    file, else as they are now): what `manifest(root, previous)` needs to hash only the
    files that changed since."""
    stats = stats or {}
    kept = {}
    for rel, entry in found.items():
        if entry[0] == "f":
            info = stats.get(rel) or os.lstat(os.path.join(root, rel))
            kept[rel] = [*entry[:4], *_when(info)]
    return kept


# ----- the record of the last push, in the root: the user's own, or not used -------------
def recorded(root: str) -> dict[str, list[Any]]:
    """The manifest (with mtimes) the last push left in `root`; empty when there is none,
    or when it is not the user's own file (root_problem says why)."""
    path = os.path.join(root, MANIFEST_NAME)
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return {}
    with os.fdopen(fd) as handle:
        if owned.not_own(path, os.fstat(fd), os.getuid(), directory=False, elsewhere=""):
            return {}
        try:
            return json.load(handle)
        except ValueError:
            return {}


def record(
    root: str, found: dict[str, list[Any]], stats: dict[str, os.stat_result] | None = None
) -> None:
    """Leave `found`, every file of which is now in `root`, there with mtimes (from `stats`,
    taken when the files were checked), readable by the user alone, so the next look hashes
    only what changed. Written under a new name, then renamed: a link or another user's
    file in its place is never followed or written through."""
    data = json.dumps(with_mtimes(root, found, stats), separators=(",", ":")).encode()
    final = os.path.join(root, MANIFEST_NAME)
    temporary = f"{final}.{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)  # what an interrupted record of this pid left
    fd = os.open(temporary, flags, 0o600)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    os.rename(temporary, final)


def root_problem(root: str, uid: int | None = None) -> owned.NotOwn | None:
    """Why a node does not push to `root` (as the user `uid`): the root, or the record of
    the last push in it, is another user's or writable by others, who could then plant
    files in the environment or make the node skip them. None when both are the user's
    own (or not there yet)."""
    uid = os.getuid() if uid is None else uid
    try:
        problem = owned.not_own(root, os.lstat(root), uid, directory=True, elsewhere=(
            f"remove it as its owner (rm -rf -- {root}) and push again, or push an "
            "environment at a path of your own"))  # fmt: skip
        if problem is not None:
            return problem
        cache = os.path.join(root, MANIFEST_NAME)
        problem = owned.not_own(cache, os.lstat(cache), uid, directory=False, elsewhere="")
    except FileNotFoundError:
        return None  # no root, or no record in it
    # a record others could write is not trusted once they no longer can: it goes
    fix = f"remove it (rm -f -- {cache}, as its owner or root) and push again"
    return None if problem is None else owned.NotOwn(problem.message, fix)
