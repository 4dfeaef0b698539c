"""`orch env push` on a node, the new environment: built in a sibling directory of the root
(hard links for what did not change, this node's files from the stream, each checked
against the head's manifest) and swapped in with one rename (renameat2 RENAME_EXCHANGE),
so that a process starting meanwhile sees the old environment or the new one, never half of
each; one push at a time per user and root (a lock in the user's own directory), and what an
interrupted push left removed. Anything wrong removes the sibling and leaves the root as it
was. STANDARD LIBRARY ONLY, shipped beside remote/envpush.py (as orch_envpush_staging).
"""

from __future__ import annotations

import contextlib
import ctypes
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
from types import FrameType
from typing import IO, Any, NoReturn

try:  # on a node, loaded beside the program
    import orch_environment as environment
    import orch_envpush_manifest as envpush_manifest
    import orch_owned as owned
except ImportError:
    from orchestrator.remote import environment, envpush_manifest, owned

STAGING_INFIX = ".orch-new-"
_CHUNK = 1 << 20  # the stream's buffer, and what a received file is written at a time
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class Staging:
    """The sibling directory the new environment is built in; removed unless it was swapped
    in (on any error, and, with `on_signals`, on SIGHUP/SIGTERM/SIGINT: the head went away)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = f"{root}{STAGING_INFIX}{os.getpid()}"

    def on_signals(self) -> None:
        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._interrupted)

    def _interrupted(self, signum: int, _frame: FrameType | None) -> None:
        self.abandon(128 + signum)

    def abandon(self, code: int) -> NoReturn:
        self.remove()
        os._exit(code)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def nearest_existing(path: str) -> str:
    """`path`, or its nearest ancestor that exists."""
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


# ----- the new environment, built beside the old ------------------------------------------
def _safe(rel: str) -> str:
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or not rel:
        raise ValueError(f"refusing path {rel!r} in the stream")
    return rel


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _receive_file(
    tar: tarfile.TarFile, member: tarfile.TarInfo, target: str, want: list[Any]
) -> None:
    digest = hashlib.sha256()
    source = tar.extractfile(member)
    with open(target, "wb") as out:
        for chunk in iter(lambda: source.read(_CHUNK), b""):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != want[2]:
        raise ValueError(f"{member.name}: sha256 does not match the head's manifest "
                         "(changed on the head during the push? push again)")  # fmt: skip
    os.chmod(target, want[3])
    os.utime(target, ns=(int(member.mtime * 1e9), int(member.mtime * 1e9)))


def _copy_tree(staging: str, root: str, skip: set[str]) -> None:
    """The current root as hard links (symlinks remade), without what `skip` names."""
    os.makedirs(staging)
    if not os.path.isdir(root):
        return
    for top, dirs, files in os.walk(root):
        rel_top = os.path.relpath(top, root)
        rel_of = (lambda n: n) if rel_top == "." else (lambda n, t=rel_top: t + "/" + n)
        dirs[:] = [d for d in dirs if rel_of(d) not in skip]
        for name in dirs:
            os.mkdir(
                os.path.join(staging, rel_of(name)),
                stat.S_IMODE(os.lstat(os.path.join(top, name)).st_mode) | 0o700,
            )
        for name in files:
            rel = rel_of(name)
            if rel in skip or rel == envpush_manifest.MANIFEST_NAME:
                continue
            source, target = os.path.join(top, name), os.path.join(staging, rel)
            if os.path.islink(source):
                os.symlink(os.readlink(source), target)
            else:
                _link_or_copy(source, target)


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


def build(
    staging: str, root: str, want_sha256: str, stream: IO[bytes]
) -> tuple[int, int, dict[str, list[Any]]]:
    """The new environment in `staging`: the root's files but those removed or replaced,
    the head's new directories, then this node's files from the stream (the others are
    skipped). Returns (files received, bytes received, the head's manifest)."""
    with tarfile.open(fileobj=stream, mode="r|", bufsize=_CHUNK) as tar:
        head = read_head_manifest(tar, want_sha256)
        have = (
            envpush_manifest.manifest(root, envpush_manifest.recorded(root))
            if os.path.isdir(root)
            else {}
        )
        mine = envpush_manifest.delta(head, have)
        send = mine["send"]
        _copy_tree(staging, root, set(mine["remove"]) | set(send))
        for rel, mode in sorted(mine["dirs"].items()):
            os.makedirs(os.path.join(staging, _safe(rel)), exist_ok=True)
            os.chmod(os.path.join(staging, rel), mode | 0o700)
        received = 0
        while (member := tar.next()) is not None:
            rel = _safe(member.name)
            want = send.get(rel)
            if want is None:
                continue  # another node's: passed on, not kept
            target = os.path.join(staging, rel)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)  # a directory the head has as a file or link now
            if member.issym() and want[0] == "l":
                os.symlink(member.linkname, target)
            elif member.isfile() and want[0] == "f":
                _receive_file(tar, member, target, want)
            else:
                raise ValueError(f"{rel}: not what the head's manifest says it is")
            received += 1
    missing = [rel for rel in send if not os.path.lexists(os.path.join(staging, rel))]
    if missing:
        raise ValueError(f"{len(missing)} file(s) never arrived, e.g. {missing[0]}")
    return received, mine["bytes"], head


def exchange(staging: str, root: str) -> str | None:
    """Swap the built directory in, in one rename; returns the old one's path (or None)."""
    if not os.path.lexists(root):
        os.rename(staging, root)
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    done = libc.renameat2(_AT_FDCWD, staging.encode(), _AT_FDCWD, root.encode(), _RENAME_EXCHANGE)
    if done != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot exchange {staging} and {root}: {os.strerror(err)}")
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
    root: str, want_sha256: str, stream: IO[bytes], staging: Staging | None = None
) -> dict[str, Any]:
    """Build the root's new environment from the stream and swap it in: {"ok", "received",
    "received_bytes", "fingerprint"} or {"ok": False, "error"}; the root is untouched then."""
    staging = staging or Staging(root)
    try:
        received, size, head = build(staging.path, root, want_sha256, stream)
        envpush_manifest.record(staging.path, head)
        old = exchange(staging.path, root)
    except (OSError, ValueError, tarfile.TarError, EOFError) as err:
        staging.remove()
        return {"ok": False, "error": str(err) or type(err).__name__}
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return {"ok": True, "received": received, "received_bytes": size,
            "fingerprint": _fingerprint(root)}  # fmt: skip


# ----- one push at a time, and what an interrupted one left -------------------------------
def take_lock(root: str, node_root: str = "") -> int | None:
    """The push's lock for `root`, in the user's own directory (nobody else can hold or
    plant it; `node_root`: the user's ORCH_NODE_ROOT); the open file, or None when another
    push of the root holds it."""
    where = owned.user_directories(os.getuid(), ["env-push"], node_root)
    place = nearest_existing(os.path.dirname(root))  # the directory itself, where /tmp is shared
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
