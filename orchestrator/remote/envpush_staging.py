"""`orch env push` on a node, the new environment: built in a sibling directory of the root
under umask 077, from the head's manifest (each directory and file with the head's mode,
each link with its target; hard links for the files that did not change, checked again
just before the swap since a write in place reaches both trees; this node's files from the
stream, each checked against the manifest) and swapped in with one rename (renameat2
RENAME_EXCHANGE), so that a process starting meanwhile sees the old environment or the new
one, never half of each. The swap and the removal of the sibling happen in one thread
under one lock; the head going away only says so. One push at a time per user and root (a
lock in the user's own directory), and what an interrupted push left removed. Anything
wrong removes the sibling and leaves the root as it was. STANDARD LIBRARY ONLY, shipped
beside remote/envpush.py (as orch_envpush_staging).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import shutil
import signal
import stat
import subprocess
import tarfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any

try:  # on a node, loaded beside the program
    import orch_digest as digest
    import orch_environment as environment
    import orch_envpush_manifest as envpush_manifest
    import orch_filesystem as filesystem
    import orch_owned as owned
except ImportError:
    from orchestrator.remote import digest, environment, envpush_manifest, filesystem, owned

STAGING_INFIX = ".orch-new-"
_CHUNK = 1 << 20  # the stream's buffer, and what a received file is written at a time
_PRIVATE_UMASK = 0o077  # everything is made the user's alone, then given the head's mode
_WRITE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class Abandoned(Exception):
    """The head went away (its channel closed, or a signal): the build stops, the root is
    kept as it was."""


class Staging:
    """The sibling directory the new environment is built in, swapped in or removed by one
    thread (the program's main one) under one lock. The head going away (the stdin watcher,
    or SIGHUP/SIGTERM/SIGINT with `on_signals`) only says so (`stop`); the build stops at
    its next read or entry, or at once on a signal while `interruptible`, and the flag is
    checked under the lock just before the swap: the swap happens whole or not at all."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = f"{root}{STAGING_INFIX}{os.getpid()}"
        self.stopped = threading.Event()
        self.code = 1  # the program's exit status once stopped
        self.swapped = False
        self._lock = threading.Lock()
        self._interruptible = False

    def stop(self, code: int = 1) -> None:
        """Say that the head went away; any thread, or a signal handler. Nothing else."""
        if not self.stopped.is_set():
            self.code = code
        self.stopped.set()

    def check(self) -> None:
        if self.stopped.is_set():
            raise Abandoned("the head went away")

    def guard(self, read: Callable[[int], bytes]) -> Callable[[int], bytes]:
        """`read`, checking before each call that the head is still there."""

        def guarded(size: int) -> bytes:
            self.check()
            return read(size)

        return guarded

    def on_signals(self) -> None:
        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._interrupted)

    def _interrupted(self, signum: int, _frame: FrameType | None) -> None:
        self.stop(128 + signum)
        if self._interruptible:  # the main thread is building (or passing on): stop there
            self._interruptible = False
            raise Abandoned(f"the head went away (signal {signum})")

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A stretch that touches nothing but the sibling (or the stream): a signal may end
        it where it is."""
        try:
            self._interruptible = True
            self.check()
            yield
        finally:
            self._interruptible = False

    def swap(self) -> str | None:
        """The built directory swapped in (the old one's path returned, or None); Abandoned,
        and nothing swapped, when the head went away before."""
        with self._lock:
            self.check()
            old = exchange(self.path, self.root)
            self.swapped = True
        return old

    def remove(self) -> None:
        """The sibling, unless it was swapped in (then it holds the old environment, which
        the caller removes)."""
        with self._lock:
            if not self.swapped:
                shutil.rmtree(self.path, ignore_errors=True)


@contextlib.contextmanager
def _private_umask() -> Iterator[None]:
    old = os.umask(_PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(old)


# ----- the new environment, built beside the old ------------------------------------------
@dataclass(frozen=True)
class Built:
    """What a build received, and the head's manifest with the lstat of every file of the
    new environment as it was checked (what the record keeps)."""

    received: int
    received_bytes: int
    head: dict[str, list[Any]]
    stats: dict[str, os.stat_result]


def _safe(rel: str) -> str:
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or not rel:
        raise ValueError(f"refusing path {rel!r} in the stream")
    return rel


def _link_or_copy(source: str, target: str) -> bool:
    """Whether `target` is a hard link of `source` (else a copy: a file system without)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
        return False
    return True


def _receive_file(
    tar: tarfile.TarFile, member: tarfile.TarInfo, target: str, want: list[Any]
) -> os.stat_result:
    hasher = hashlib.sha256()
    source = tar.extractfile(member)
    with os.fdopen(os.open(target, _WRITE_NEW, 0o600), "wb") as out:
        for chunk in iter(lambda: source.read(_CHUNK), b""):
            hasher.update(chunk)
            out.write(chunk)
    if hasher.hexdigest() != want[2]:
        raise ValueError(f"{member.name}: sha256 does not match the head's manifest "
                         "(changed on the head during the push? push again)")  # fmt: skip
    os.chmod(target, want[3])
    os.utime(target, ns=(int(member.mtime * 1e9), int(member.mtime * 1e9)))
    return os.lstat(target)


def _receive_cache(
    tar: tarfile.TarFile, member: tarfile.TarInfo, path: str, rel: str, want: list[Any]
) -> None:
    """The head's bytecode of a file this node was sent (`want`: [size, sha256, the file's
    mode]), in its directory's __pycache__: kept if it is what the head's manifest lists,
    else dropped (a cache: the interpreter compiles the file itself)."""
    target = os.path.join(path, rel)
    directory = os.path.dirname(target)
    try:
        if not os.path.lexists(directory):
            parent = os.lstat(os.path.dirname(directory))
            os.mkdir(directory, 0o700)
            mode = stat.S_IMODE(parent.st_mode) | envpush_manifest.OWNER_BITS
            os.chmod(directory, mode & ~envpush_manifest.ROOT_NOT_WRITABLE)
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return  # the head's file of that name is there: no cache
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)  # the old environment's, carried: not the new file's
        _receive_file(tar, member, target, ["f", want[0], want[1], want[2] & 0o755 | 0o600])
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            os.unlink(target)


def _lay_out(
    path: str, root: str, head: dict[str, list[Any]], send: dict[str, Any]
) -> dict[str, bool]:
    """The head's tree in `path`, from its manifest: each directory made with the mode the
    node gives it, each link with the manifest's target, each file the node has already
    hard-linked from the root (the others come from the stream). Returns the files taken
    from the root (-> whether as hard links)."""
    _make_parents(os.path.dirname(path))
    os.mkdir(path, 0o700)
    kept: dict[str, bool] = {}
    for rel, entry in sorted(head.items()):  # a directory before what is in it
        if rel == envpush_manifest.ROOT:
            continue
        target = os.path.join(path, _safe(rel))
        if entry[0] == "d":
            os.mkdir(target, 0o700)
            os.chmod(target, envpush_manifest.built_mode(rel, entry[3]))
        elif rel in send:
            continue
        elif entry[0] == "l":
            os.symlink(entry[2], target)
        else:
            kept[rel] = _link_or_copy(os.path.join(root, rel), target)
    for rel, entry in head.items():
        if entry[0] == "d":
            _carry_caches(root, path, rel, head)
    top = head.get(envpush_manifest.ROOT)
    if top is not None:
        os.chmod(path, envpush_manifest.built_mode(envpush_manifest.ROOT, top[3]))
    return kept


def _make_parents(directory: str) -> None:
    """The directories the root will be in, where missing: readable by all, writable by
    the user alone (whatever the umask)."""
    missing = []
    while not os.path.lexists(directory) and directory != os.path.dirname(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for made in reversed(missing):
        os.mkdir(made, 0o700)
        os.chmod(made, 0o755)


def _carry_caches(root: str, path: str, rel: str, head: dict[str, list[Any]]) -> None:
    """The directory's __pycache__ from the root (the user's own .pyc files only), so a job
    does not compile the environment again after each push."""
    name = "__pycache__" if rel == envpush_manifest.ROOT else f"{rel}/__pycache__"
    old, new = os.path.join(root, name), os.path.join(path, name)
    uid = os.getuid()
    try:
        info = os.lstat(old)
        if name in head or not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            return
        os.mkdir(new, 0o700)
        with os.scandir(old) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if entry.name.endswith(".pyc") and stat.S_ISREG(st.st_mode) and st.st_uid == uid:
                    _link_or_copy(entry.path, os.path.join(new, entry.name))
        os.chmod(new, stat.S_IMODE(info.st_mode) & ~envpush_manifest.ROOT_NOT_WRITABLE)
    except OSError:
        return  # a cache: the job makes it again
def _verify_kept(
    path: str, root: str, kept: dict[str, bool], head: dict[str, list[Any]],
    seen: dict[str, os.stat_result],
) -> dict[str, os.stat_result]:
    """The files taken from the root, checked just before the swap: a hard link is the old
    tree's file itself, so one written in place meanwhile (its mtime, size or inode moved
    since it was hashed) is read again, and the push refused if it is no longer the
    head's. Returns their lstat as checked."""
    checked = {}
    for rel, linked in kept.items():
        target = os.path.join(path, rel)
        now, before = os.lstat(target), seen.get(rel)
        if not linked or before is None or _moved(before, now):
            now = _hash_checked(target, rel, root, head[rel])
        checked[rel] = now
    return checked


def _moved(before: os.stat_result, now: os.stat_result) -> bool:
    return (before.st_ino, before.st_size, before.st_mtime_ns) != (
        now.st_ino, now.st_size, now.st_mtime_ns)  # fmt: skip


def _hash_checked(target: str, rel: str, root: str, want: list[Any]) -> os.stat_result:
    """`target` read again: the user's own regular file, still the head's, not written
    while it was read; ValueError naming it otherwise."""
    before = os.lstat(target)
    same = (stat.S_ISREG(before.st_mode) and before.st_uid == os.getuid()
            and digest.sha256_of(target) == want[2])  # fmt: skip
    if not same or _moved(before, os.lstat(target)):
        raise ValueError(
            f"{os.path.join(root, rel)} was written while the push built the new environment "
            "(it is shared with the old one until the swap): push again once nothing writes "
            f"in {root}"
        )
    return before


def read_head_manifest(tar: tarfile.TarFile, want_sha256: str) -> dict[str, list[Any]]:
    """The stream's first member: the head's manifest, checked against the sha256 the head
    sent on its own channel (what the nodes pass on is only trusted through it)."""
    member = tar.next()
    if member is None or member.name != envpush_manifest.STREAM_MANIFEST or not member.isfile():
        raise ValueError("the stream does not start with the head's manifest")
    data = tar.extractfile(member).read()
    if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), want_sha256):
        raise ValueError("the head's manifest in the stream does not match its sha256")
    return envpush_manifest.unpack(data.decode())


def build(staging: Staging, want_sha256: str, stream: IO[bytes]) -> Built:
    """The new environment in the sibling: the head's tree from its manifest, the files
    the node has as hard links from the root, this node's files from the stream (the
    others are skipped), the linked files checked again at the end."""
    root = staging.root
    with tarfile.open(fileobj=stream, mode="r|", bufsize=_CHUNK) as tar:
        head = read_head_manifest(tar, want_sha256)
        caches = envpush_manifest.take_caches(head)
        seen: dict[str, os.stat_result] = {}
        have = (
            envpush_manifest.manifest(root, envpush_manifest.recorded(root),
                                      owner=os.getuid(), stats=seen, check=staging.check)
            if os.path.isdir(root)
            else {}
        )  # fmt: skip
        mine = envpush_manifest.delta(head, have)
        send = mine["send"]
        kept = _lay_out(staging.path, root, head, send)
        stats: dict[str, os.stat_result] = {}
        while (member := tar.next()) is not None:
            staging.check()
            rel = _safe(member.name)
            want = send.get(rel)
            if want is None:
                source = envpush_manifest.cache_source(rel)
                if rel in caches and source in send and member.isfile():
                    _receive_cache(tar, member, staging.path, rel, caches[rel] + [send[source][3]])
                continue  # another node's: passed on, not kept
            target = os.path.join(staging.path, rel)
            if member.issym() and want[0] == "l":
                if member.linkname != want[2]:  # the manifest is the head's; the stream not
                    raise ValueError(f"{rel}: a link to {member.linkname!r} in the stream, to "
                                     f"{want[2]!r} in the head's manifest")  # fmt: skip
                os.symlink(want[2], target)
            elif member.isfile() and want[0] == "f":
                stats[rel] = _receive_file(tar, member, target, want)
            else:
                raise ValueError(f"{rel}: not what the head's manifest says it is")
    missing = [rel for rel in send if not os.path.lexists(os.path.join(staging.path, rel))]
    if missing:
        raise ValueError(f"{len(missing)} file(s) never arrived, e.g. {missing[0]}")
    stats.update(_verify_kept(staging.path, root, kept, head, seen))
    return Built(len(send), mine["bytes"], head, stats)


def exchange(staging: str, root: str) -> str | None:
    """Swap the built directory in, in one rename; returns the old one's path (or None)."""
    if not os.path.lexists(root):
        os.rename(staging, root)
        return None
    filesystem.exchange(staging, root)
    return staging


def _fingerprint(root: str) -> str | None:
    """The new environment's fingerprint, as its own interpreter reports it."""
    python = os.path.join(root, "bin", "python")
    source = getattr(environment, "__orch_source__", None)
    if source is None:  # run from orch's own tree (tests)
        with open(environment.__file__) as handle:
            source = handle.read()
    try:
        done = subprocess.run([python, "-c", source], capture_output=True, timeout=120, check=False)
        return json.loads(done.stdout)["fingerprint"]
    except (OSError, ValueError, KeyError, AttributeError, subprocess.TimeoutExpired):
        return None


def receive(
    root: str,
    want_sha256: str,
    stream: IO[bytes],
    staging: Staging | None = None,
    swap_guard: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
) -> dict[str, Any]:
    """Build the root's new environment from the stream and swap it in, inside `swap_guard`
    (which may refuse the swap with a ValueError): {"ok", "received", "received_bytes",
    "fingerprint"} or {"ok": False, "error"[, "fix"]}; the root is untouched then. Refused
    when the root, or the record in it, is not the user's own."""
    staging = staging or Staging(root)
    try:
        refused = envpush_manifest.root_problem(root)
        if refused is not None:
            return {"ok": False, "error": refused.message, "fix": refused.fix}
        with _private_umask():
            with staging.interruptible():
                built = build(staging, want_sha256, stream)
            envpush_manifest.record(staging.path, built.head, built.stats)
            with swap_guard():
                old = staging.swap()
    except (OSError, ValueError, tarfile.TarError, EOFError, Abandoned) as err:
        staging.remove()
        return {"ok": False, "error": str(err) or type(err).__name__}
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    fingerprint = None if staging.stopped.is_set() else _fingerprint(root)
    return {"ok": True, "received": built.received, "received_bytes": built.received_bytes,
            "fingerprint": fingerprint}  # fmt: skip


# ----- one push at a time, and what an interrupted one left -------------------------------
def take_lock(root: str, node_root: str = "") -> int | None:
    """The push's lock for `root`, in the user's own directory (nobody else can hold or
    plant it; `node_root`: the user's ORCH_NODE_ROOT); the open file, or None when another
    push of the root holds it."""
    where = owned.user_directories(os.getuid(), ["env-push"], node_root)
    # The directory itself, where /tmp is shared.
    place = filesystem.nearest_existing(os.path.dirname(root))
    key = f"{root}\0{os.stat(place).st_dev}\0{os.stat(place).st_ino}"
    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    fd = os.open(os.path.join(where, name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def remove_stale(root: str) -> None:
    """Sibling build directories of the user's that an interrupted push left (the lock is
    held: none of them is being built)."""
    parent, name = os.path.split(root)
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return
    for entry in names:
        path = os.path.join(parent, entry)
        with contextlib.suppress(OSError):
            if entry.startswith(name + STAGING_INFIX) and os.lstat(path).st_uid == os.getuid():
                shutil.rmtree(path, ignore_errors=True)
