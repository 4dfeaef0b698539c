"""The checkpoint files one node sends another, on the wire: for each file a JSON header
line {"path", "size"} then exactly `size` bytes, then a trailer line {"end": true,
"sha256": {path: hex}, "changed": [paths]}. The writer reads each file without following a
link, notes a file that changed while it was read (its size, mtime or inode before and
after; one that vanished or could not be opened counts too: what is sent of it is not the
checkpoint), and keeps to a bandwidth cap over the whole stream. The reader takes only the
paths it was asked for, each of its listed size, creates each file anew (never through a
link, never over another), hashes it as it writes, and checks it against the trailer (and
against the sha256 it was asked for, where given). Paths are relative, "/" separated, and
never leave the directory they are under. STANDARD LIBRARY ONLY, shipped beside
remote/checkpoint_node.py (as orch_checkpoint_stream).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

CHUNK = 1 << 20  # read, sent and written at a time
HEADER_LIMIT = 64 << 10  # one file's header line, at most
TRAILER_PER_FILE = 160  # bytes a trailer may spend per file asked for, beyond its path
_READ = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = _READ | getattr(os, "O_DIRECTORY", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafePath(ValueError):
    """A path that would leave the directory it is under, or is no path at all."""


def relative_path(path: object) -> str:
    """`path` as given when it is relative, "/" separated and stays below its directory (no
    `..`, `.` or empty part, not absolute, no NUL); UnsafePath otherwise."""
    if not isinstance(path, str) or not path:
        raise UnsafePath(f"{path!r} is not a path")
    if "\0" in path or path.startswith("/"):
        raise UnsafePath(f"{path!r} is not a relative path")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise UnsafePath(f"{path!r} leaves its directory or is not plain (., .., //)")
    return path


def one_name(name: object, what: str) -> str:
    """`name` when it is one plain name (a checkpoint entry, a node): no "/", not . or ..;
    UnsafePath naming `what` otherwise."""
    if not isinstance(name, str) or "/" in name:
        raise UnsafePath(f"{what} {name!r} is not a single name")
    return relative_path(name)


# ----- files read and written below a directory, never through a link ---------------------
def open_below(top: str, path: str) -> int:
    """A read descriptor for the regular file `top`/`path`, each directory on the way and
    the file itself opened without following a link (OSError ELOOP on one)."""
    parts = relative_path(path).split("/")
    fd = os.open(top, _DIRECTORY)
    try:
        for part in parts[:-1]:
            inner = os.open(part, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        found = os.open(parts[-1], _READ, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(found).st_mode):
        os.close(found)
        raise IsADirectoryError(f"{top}/{path} is not a regular file")
    return found


def sha256_of_file(top: str, path: str) -> tuple[int, str]:
    """(size, hex sha256) of the regular file `top`/`path`, read without following a link."""
    fd = open_below(top, path)
    digest, size = hashlib.sha256(), 0
    try:
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return size, digest.hexdigest()


def parent_below(top: str, path: str, mode: int = 0o600) -> tuple[int, str]:
    """(a descriptor of the directory `top`/`path` goes in, made as needed, and the last
    part of `path`): directories private when `mode` is; ELOOP for a link on the way."""
    parts = relative_path(path).split("/")
    fd = os.open(top, _DIRECTORY)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):  # private files, private directories
                os.mkdir(part, 0o777 if mode & 0o077 else 0o700, dir_fd=fd)
            inner = os.open(part, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def create_below(top: str, path: str, mode: int = 0o600) -> int:
    """A write descriptor for the new file `top`/`path` (its directories made as needed);
    FileExistsError when something is there already, ELOOP for a link on the way."""
    fd, name = parent_below(top, path, mode)
    try:
        return os.open(name, _CREATE, mode, dir_fd=fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# ----- the writer ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Outgoing:
    """One file to send: `path` as the stream names it, read from `top`/`path`."""

    path: str
    top: str


@dataclass(frozen=True)
class Sent:
    """What a stream carried: its bytes, each whole file's sha256, the files that changed
    while read (or could not be read: `unreadable`, path -> why)."""

    bytes: int
    sha256: Mapping[str, str]
    changed: tuple[str, ...]
    unreadable: Mapping[str, str] = field(default_factory=dict)


class Throttle:
    """Sleeps so that the bytes passed, over the time since the stream began, stay at or
    under `bytes_per_s` (0: no cap)."""

    def __init__(self, bytes_per_s: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.bytes_per_s, self._clock = bytes_per_s, clock
        self._start, self._passed = clock(), 0

    def passed(self, count: int) -> None:
        self._passed += count
        if self.bytes_per_s <= 0:
            return
        ahead = self._passed / self.bytes_per_s - (self._clock() - self._start)
        if ahead > 0:
            time.sleep(ahead)


def _line(doc: object) -> bytes:
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev


def _send_file(item: Outgoing, fd: int, send: Callable[[bytes], object],
               throttle: Throttle) -> tuple[int, str, str]:  # fmt: skip
    """(bytes sent, their sha256, why the file is not sent whole or "") for one opened file:
    its header, then exactly the size its header said (zeros for what could not be read)."""
    before = os.fstat(fd)
    size, digest, left, problem = before.st_size, hashlib.sha256(), before.st_size, ""
    send(_line({"path": item.path, "size": size}))
    while left > 0:
        want = min(CHUNK, left)
        try:
            chunk = os.read(fd, want)
        except OSError as err:
            problem, chunk = f"cannot be read: {err.strerror}", b""
        if not chunk:  # it shrank (or broke): the header's size is still sent
            problem, chunk = problem or "changed while sent", b"\0" * want
        digest.update(chunk)
        send(chunk)
        throttle.passed(len(chunk))
        left -= len(chunk)
    try:  # the writer may have put a new file in its place meanwhile
        now = os.stat(os.path.join(item.top, item.path), follow_symlinks=False)
    except OSError:
        now = None
    if not problem and (now is None or _identity(os.fstat(fd)) != _identity(before)
                        or _identity(now) != _identity(before)):  # fmt: skip
        problem = "changed while sent"
    return size, digest.hexdigest(), problem


def write_stream(send: Callable[[bytes], object], files: Sequence[Outgoing],
                 bandwidth: int = 0) -> Sent:  # fmt: skip
    """Every file of `files` on `send` (a socket's sendall), then the trailer. A file that
    cannot be opened (gone, now a link) is sent empty and named changed: the receiver keeps
    nothing of the stream then. The connection failing raises OSError."""
    throttle = Throttle(bandwidth)
    total, sha256, changed, unreadable = 0, {}, [], {}
    for item in files:
        try:
            fd = open_below(item.top, item.path)
        except OSError as err:
            unreadable[item.path] = f"{os.path.join(item.top, item.path)}: {err.strerror or err}"
            send(_line({"path": item.path, "size": 0}))
            changed.append(item.path)
            continue
        try:
            size, sha256[item.path], problem = _send_file(item, fd, send, throttle)
        finally:
            os.close(fd)
        total += size
        if problem:
            changed.append(item.path)
            if problem != "changed while sent":
                unreadable[item.path] = f"{os.path.join(item.top, item.path)} {problem}"
    send(_line({"end": True, "sha256": sha256, "changed": changed}))
    return Sent(total, sha256, tuple(changed), unreadable)


# ----- the reader ---------------------------------------------------------------------------
class StreamError(Exception):
    """A stream not taken whole: what was wrong, and the files that changed while sent."""

    def __init__(self, message: str, changed: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.changed = tuple(changed)


@dataclass(frozen=True)
class Wanted:
    """A file the reader takes: its size, and its sha256 when known ("": the trailer's)."""

    size: int
    sha256: str = ""


@dataclass(frozen=True)
class FileDigest:
    size: int
    sha256: str


@dataclass(frozen=True)
class Received:
    """What a stream brought: each file's size and sha256, and the bytes in all."""

    files: Mapping[str, FileDigest]
    bytes: int


class Claims:
    """The paths some stream into a directory has begun: several streams at once (from
    several nodes) each bring a path once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: set[str] = set()

    def take(self, path: str) -> bool:
        with self._lock:
            if path in self._taken:
                return False
            self._taken.add(path)
            return True


def _header(source: BinaryIO, limit: int) -> dict[str, object]:
    try:
        line = source.readline(limit)
    except OSError as err:
        raise StreamError(f"the stream broke: {err}") from None
    if not line.endswith(b"\n"):
        said = "ended early" if len(line) < limit else "sent a line too long"
        raise StreamError(f"the stream {said}")
    try:
        doc = json.loads(line)
    except ValueError:
        raise StreamError("the stream sent something that is not a header") from None
    if not isinstance(doc, dict):
        raise StreamError("the stream sent something that is not a header")
    return doc


def _take_file(source: BinaryIO, target: str, path: str, size: int, mode: int) -> str:
    """The next `size` bytes of the stream into the new file `target`/`path`; its sha256."""
    try:
        fd = create_below(target, path, mode)
    except OSError as err:
        raise StreamError(f"{path} cannot be created in {target}: {err.strerror}") from None
    digest, left = hashlib.sha256(), size
    try:
        while left > 0:
            chunk = source.read(min(CHUNK, left))
            if not chunk:
                raise StreamError(f"the stream ended in the middle of {path}")
            digest.update(chunk)
            write_all(fd, chunk)
            left -= len(chunk)
    except OSError as err:
        raise StreamError(f"{path}: {err.strerror or err}") from None
    finally:
        os.close(fd)
    return digest.hexdigest()


def _checked_header(doc: Mapping[str, object], wanted: Mapping[str, Wanted],
                    claims: Claims) -> tuple[str, int]:  # fmt: skip
    try:
        path = relative_path(doc.get("path"))
    except UnsafePath as err:
        raise StreamError(f"the stream sent a path that is not allowed: {err}") from None
    size = doc.get("size")
    if path not in wanted:
        raise StreamError(f"the stream sent {path}, which was not asked for")
    if not isinstance(size, int) or size < 0:
        raise StreamError(f"the stream's header of {path} has no size")
    if size != wanted[path].size:
        raise StreamError(f"{path} is {size} bytes, not the {wanted[path].size} asked for: it "
                          "changed since it was listed", changed=[path])  # fmt: skip
    if not claims.take(path):
        raise StreamError(f"the stream sent {path} a second time")
    return path, size


def _check_trailer(doc: Mapping[str, object], got: Mapping[str, FileDigest]) -> None:
    changed = doc.get("changed") or []
    sha256 = doc.get("sha256")
    if not isinstance(changed, list) or not isinstance(sha256, dict):
        raise StreamError("the stream's trailer is not one")
    if changed:
        shown = ", ".join(str(path) for path in changed[:3])
        raise StreamError(f"{len(changed)} file(s) changed while sent ({shown}): still being "
                          "written", changed=[str(path) for path in changed])  # fmt: skip
    for path, digest in got.items():
        said = sha256.get(path)
        if not isinstance(said, str) or not hmac.compare_digest(said, digest.sha256):
            raise StreamError(f"{path} arrived with another sha256 than its sender read")


def trailer_limit(wanted: Mapping[str, Wanted]) -> int:
    """The longest trailer a stream of `wanted` may send."""
    return HEADER_LIMIT + sum(2 * len(path) + TRAILER_PER_FILE for path in wanted)


def read_stream(source: BinaryIO, wanted: Mapping[str, Wanted], target: str,
                claims: Claims | None = None, mode: int = 0o600) -> Received:  # fmt: skip
    """A stream's files into `target` (each file made anew, with `mode`), until its trailer;
    StreamError on anything not asked for, a size or sha256 not as asked or as the trailer
    says, a changed file, or a stream that ends early. What was written is then left for the
    caller to remove (it reads into a directory of its own)."""
    claims = claims if claims is not None else Claims()
    got: dict[str, FileDigest] = {}
    total = 0
    while True:
        doc = _header(source, trailer_limit(wanted))
        if doc.get("end") is True:
            _check_trailer(doc, got)
            return Received(got, total)
        path, size = _checked_header(doc, wanted, claims)
        sha256 = _take_file(source, target, path, size, mode)
        want = wanted[path].sha256
        if want and not hmac.compare_digest(want, sha256):
            raise StreamError(f"{path} arrived with sha256 {sha256}, not the {want} asked for")
        got[path] = FileDigest(size, sha256)
        total += size
