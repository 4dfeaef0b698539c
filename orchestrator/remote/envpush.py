"""`orch env push` on a node: STANDARD LIBRARY ONLY, shipped inline (`python -c`), with
environment.py, owned.py and procs.py loaded beside it (as orch_<name>). Run with the base
interpreter the head's environment was made from, so what it reports is what the
environment will run on.

- look: {"root", "marker"} as its argument, one JSON line printed: is the head's directory
  seen here (the marker the head wrote in it: a shared filesystem, left alone), this
  interpreter's version, ABI and platform, the free disk where the root is (or would be),
  whether the root is a mount point, the processes (and orch jobs) running from it, and the
  manifest of what the root holds now (zlib + base64 JSON: relative path -> [kind, size,
  sha256 or link target, mode]). Hashes of files whose size and mtime match the manifest of
  the last push are taken from it rather than read again.
- receive: lines on stdin, lines on stdout. (1) {"root", "manifest_sha256", "token",
  "listen"}: takes the push's lock for the root (one push at a time per user and root),
  removes what an interrupted push left, opens a TCP port when asked, and says
  {"ready", "port"}. (2) {"source": "stdin" | "tcp", "forward": {"host", "port"} | null}:
  where the stream comes from (the head's stdin, or the previous node on the port, which
  must present the push's token), and the next node to pass it on to, byte for byte, as it
  arrives. The stream is a tar: first the head's whole manifest (checked against the
  sha256 the head sent over its own channel), then every file some node of the push needs.
  This node computes its own delta from that manifest, keeps only its files (each checked
  against its sha256), builds the new environment in a sibling directory (hard links for
  what did not change) and swaps it in with one rename (renameat2 RENAME_EXCHANGE): a
  process starting meanwhile sees the old environment or the new one, never half of each.
  It passes the stream on even when its own build fails, so one bad node does not cut the
  chain. Anything wrong (a hash, a stream that ends early, the head going away) removes the
  sibling and leaves the root as it was. (3) The answer, one JSON line.
"""

import base64
import contextlib
import ctypes
import fcntl
import hashlib
import hmac
import io
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
import zlib

try:  # on a node, loaded beside this program
    import orch_environment as environment
    import orch_owned as owned
    import orch_procs as procs
except ImportError:
    from orchestrator.remote import environment, owned, procs

MANIFEST_NAME = ".orch-manifest.json"  # kept in the root: the last push's, with mtimes
STREAM_MANIFEST = ".orch-push-manifest"  # the stream's first member: the head's manifest
MARKER_PREFIX = ".orch-push-marker-"  # a push's shared-filesystem check: not the environment's
STAGING_INFIX = ".orch-new-"
SKIPPED_DIRS = ("__pycache__",)
STALL_S = 120.0  # a link between two nodes that moves nothing for this long is given up
CONNECT_S = 30.0  # to reach the next node's port
TOKEN_S = 5.0  # for a connection to the port to present the push's token
MAX_CALLERS = 64  # connections read at once for the token; the oldest makes room for a new one
_CHUNK = 1 << 20
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def pack(doc):
    text = json.dumps(doc, separators=(",", ":"))
    return base64.b64encode(zlib.compress(text.encode(), 6)).decode()


def unpack(text):
    return json.loads(zlib.decompress(base64.b64decode(text)))


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest(root, previous=None):
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


def _entry(path, before):
    info = os.lstat(path)
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return ["l", 0, os.readlink(path), 0]
    if stat.S_ISDIR(info.st_mode):
        return ["d", 0, "", mode]
    if before and before[1] == info.st_size and before[4:5] == [info.st_mtime_ns]:
        return ["f", info.st_size, before[2], mode]
    return ["f", info.st_size, sha256_of(path), mode]


def delta(head, node):
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


def _recorded(root):
    try:
        with open(os.path.join(root, MANIFEST_NAME)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def _existing(path):
    """`path`, or its nearest ancestor that exists."""
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def _free_bytes(path):
    stats = os.statvfs(_existing(path))
    return stats.f_bavail * stats.f_frsize


def _running_from(root):
    """[pid, orch job id or None] of processes running from the root: their executable is
    there, or the interpreter they were started as (a venv's bin/python is a link to its
    base interpreter)."""
    places = (os.path.realpath(root) + "/", root.rstrip("/") + "/")
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            exe = os.readlink(f"/proc/{name}/exe")
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                first = handle.read().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if any(p.startswith(places) for p in (exe, first)):
            env = procs.environ_of(int(name)) or {}
            found.append([int(name), env.get(procs.JOB_ID_VAR)])
    return found


def look(request):
    root = os.path.realpath(request["root"])  # a link to the environment: its target
    exists = os.path.isdir(root)
    shared = exists and os.path.exists(os.path.join(root, request["marker"]))
    answer = {
        "shared": shared,
        "exists": exists,
        "real_root": root,
        "mount_point": exists and os.path.ismount(root),
        "interpreter": environment.interpreter(),
        "platform": environment.platform_facts(),
        "executable": sys.executable,
        "free_bytes": _free_bytes(root),
        "running": _running_from(root) if exists else [],
        "manifest": None,
    }
    if exists and not shared:
        answer["manifest"] = pack(manifest(root, _recorded(root)))
    return answer


# ----- the new environment, built beside the old ------------------------------------------
class Staging:
    """The sibling directory the new environment is built in; removed unless it was swapped
    in (on any error, and, with `on_signals`, on SIGHUP/SIGTERM/SIGINT: the head went away)."""

    def __init__(self, root):
        self.root = root
        self.path = f"{root}{STAGING_INFIX}{os.getpid()}"

    def on_signals(self):
        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._interrupted)

    def _interrupted(self, signum, _frame):
        self.abandon(128 + signum)

    def abandon(self, code):
        self.remove()
        os._exit(code)

    def remove(self):
        shutil.rmtree(self.path, ignore_errors=True)


def _safe(rel):
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or not rel:
        raise ValueError(f"refusing path {rel!r} in the stream")
    return rel


def _link_or_copy(source, target):
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _receive_file(tar, member, target, want):
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


def _copy_tree(staging, root, skip):
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
            if rel in skip or rel == MANIFEST_NAME:
                continue
            source, target = os.path.join(top, name), os.path.join(staging, rel)
            if os.path.islink(source):
                os.symlink(os.readlink(source), target)
            else:
                _link_or_copy(source, target)


def read_head_manifest(tar, want_sha256):
    """The stream's first member: the head's manifest, checked against the sha256 the head
    sent on its own channel (what the nodes pass on is only trusted through it)."""
    member = tar.next()
    if member is None or member.name != STREAM_MANIFEST or not member.isfile():
        raise ValueError("the stream does not start with the head's manifest")
    data = tar.extractfile(member).read()
    if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), want_sha256):
        raise ValueError("the head's manifest in the stream does not match its sha256")
    return unpack(data.decode())


def build(staging, root, want_sha256, stream):
    """The new environment in `staging`: the root's files but those removed or replaced,
    the head's new directories, then this node's files from the stream (the others are
    skipped). Returns (files received, bytes received)."""
    with tarfile.open(fileobj=stream, mode="r|", bufsize=_CHUNK) as tar:
        head = read_head_manifest(tar, want_sha256)
        mine = delta(head, manifest(root, _recorded(root)) if os.path.isdir(root) else {})
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


def with_mtimes(root, found):
    """The files of a manifest with their mtimes: what `manifest(root, previous)` needs to
    hash only the files that changed since."""
    return {
        rel: [*entry[:4], os.lstat(os.path.join(root, rel)).st_mtime_ns]
        for rel, entry in found.items()
        if entry[0] == "f"
    }


def _record(staging, head):
    """The new root's manifest with mtimes, so the next look hashes only what changed: every
    file there is the head's (kept because it matched, or received and checked)."""
    recorded = {
        rel: [*entry[:4], os.lstat(os.path.join(staging, rel)).st_mtime_ns]
        for rel, entry in head.items()
        if entry[0] == "f"
    }
    with open(os.path.join(staging, MANIFEST_NAME), "w") as handle:
        json.dump(recorded, handle, separators=(",", ":"))


def exchange(staging, root):
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


def _fingerprint(root):
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


def receive(root, want_sha256, stream, staging=None):
    """Build the root's new environment from the stream and swap it in: {"ok", "received",
    "received_bytes", "fingerprint"} or {"ok": False, "error"}; the root is untouched then."""
    staging = staging or Staging(root)
    try:
        received, size, head = build(staging.path, root, want_sha256, stream)
        _record(staging.path, head)
        old = exchange(staging.path, root)
    except (OSError, ValueError, tarfile.TarError, EOFError) as err:
        staging.remove()
        return {"ok": False, "error": str(err) or type(err).__name__}
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return {"ok": True, "received": received, "received_bytes": size,
            "fingerprint": _fingerprint(root)}  # fmt: skip


# ----- one push at a time, and what an interrupted one left -------------------------------
def take_lock(root):
    """The push's lock for `root`, in the user's own directory (nobody else can hold or
    plant it); the open file, or None when another push of the root holds it."""
    top = owned.user_directory(os.getuid())
    where = owned.private_directories(top, ["env-push"], os.getuid())
    place = _existing(os.path.dirname(root))  # the directory itself, where /tmp is shared
    key = f"{root}\0{os.stat(place).st_dev}\0{os.stat(place).st_ino}"
    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    fd = os.open(os.path.join(where, name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def remove_stale(root):
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


# ----- the stream: from the head or the previous node, on to the next -----------------------
def open_port():
    """A listening TCP port on every address of the node, for the previous node to send on."""
    try:
        server = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    except (OSError, ValueError):
        server = socket.create_server(("", 0))
    return server


def accept_upstream(server, token, deadline, head_gone):
    """The connection that presents the push's token. Connections are read side by side,
    each for TOKEN_S at most, and at most MAX_CALLERS at once: another user's connections,
    silent or saying something else, are closed and never keep the previous node out."""
    want = token.encode()
    callers = {}  # connection -> (what it said so far, when it must have said the token)
    try:
        while time.monotonic() < deadline:
            if head_gone.is_set():
                raise EOFError("the head went away")
            ready, _, _ = select.select([server, *callers], [], [], 0.5)
            now = time.monotonic()
            for sock in ready:
                if sock is server:
                    _new_caller(server, callers, now + TOKEN_S)
                    continue
                found = _read_token(sock, callers, want)
                if found is not None:
                    return found
            for sock, (_, until) in list(callers.items()):
                if now > until:
                    del callers[sock]
                    sock.close()
        raise TimeoutError("the previous node never connected")
    finally:
        for sock in callers:
            sock.close()


def _new_caller(server, callers, until):
    with contextlib.suppress(OSError):
        conn, _ = server.accept()
        if len(callers) >= MAX_CALLERS:  # the oldest makes room
            oldest = min(callers, key=lambda sock: callers[sock][1])
            del callers[oldest]
            oldest.close()
        conn.setblocking(False)
        callers[conn] = (b"", until)


def _read_token(sock, callers, want):
    """`sock` once it has said the whole token; None while it has not (closed if it never
    will: it ended, or said something else)."""
    got, until = callers[sock]
    try:
        chunk = sock.recv(len(want) - len(got))
    except BlockingIOError:
        return None
    except OSError:
        chunk = b""
    got += chunk
    if chunk and len(got) < len(want):
        callers[sock] = (got, until)
        return None
    del callers[sock]
    if chunk and hmac.compare_digest(got, want):
        sock.setblocking(True)
        sock.settimeout(STALL_S)
        return sock
    sock.close()
    return None


def connect_downstream(forward, token):
    """The next node's port, with the push's token sent; retried while the node starts."""
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            conn = socket.create_connection((forward["host"], forward["port"]), timeout=10)
            conn.settimeout(STALL_S)
            conn.sendall(token.encode())
            return conn
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


class Relay(io.RawIOBase):
    """What tarfile reads from: the upstream's bytes, each passed on to the next node as it
    is read. The next node lost (or stalled) stops the passing on, never this node's build."""

    def __init__(self, read, downstream=None):
        super().__init__()
        self._read, self.downstream = read, downstream
        self.forward_error = None
        self.total = 0
        self.read_error = None  # the upstream broke or stalled

    def _take(self, size):
        try:
            data = self._read(size)
        except OSError as err:
            self.read_error = str(err) or type(err).__name__
            raise
        return data

    def readable(self):
        return True

    def readinto(self, buffer):
        data = self._take(len(buffer))
        if not data:
            return 0
        buffer[: len(data)] = data
        self.total += len(data)
        self._pass_on(data)
        return len(data)

    def _pass_on(self, data):
        if self.downstream is None:
            return
        try:
            self.downstream.sendall(data)
        except OSError as err:
            self.forward_error = f"passing the stream on failed: {err}"
            self.drop()

    def drain(self):
        """The rest of the stream, passed on (what this node's build did not read)."""
        with contextlib.suppress(OSError):
            while data := self._take(_CHUNK):
                self.total += len(data)
                self._pass_on(data)

    def drop(self):
        if self.downstream is not None:
            with contextlib.suppress(OSError):
                self.downstream.shutdown(socket.SHUT_WR)
            self.downstream.close()
            self.downstream = None


def _say(doc):
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _watch_stdin(stdin, gone, finished, staging):
    """With the stream on a port, stdin only says the head is there: its end before the
    answer (the head's channel closed) abandons the push."""
    stdin.read()
    gone.set()
    if not finished.is_set():
        staging.abandon(1)


def relay_main(stdin):
    request = json.loads(stdin.readline() or "null")
    if not request:
        return 1  # the head went away before it asked anything
    root = os.path.realpath(request["root"])
    lock = take_lock(root)
    if lock is None:
        _say({"ok": False, "error": f"another orch env push of {root} is running on this "
              "node: wait for it to end"})  # fmt: skip
        return 1
    remove_stale(root)
    server = open_port() if request.get("listen") else None
    _say({"ready": True, "port": server.getsockname()[1] if server else None})
    route = json.loads(stdin.readline() or "null")
    if not route:
        return 1  # the head went away before the stream
    staging = Staging(root)
    staging.on_signals()
    gone, finished = threading.Event(), threading.Event()
    upstream = None
    try:
        if route["source"] == "tcp":
            watch = (stdin, gone, finished, staging)
            threading.Thread(target=_watch_stdin, args=watch, daemon=True).start()
            upstream = accept_upstream(server, request["token"], time.monotonic() + STALL_S, gone)
            read = upstream.recv
        else:
            read = stdin.read1
    except (OSError, EOFError) as err:
        os.close(lock)
        _say({"ok": False, "upstream_lost": True, "error": str(err)})
        return 1
    if server is not None:
        server.close()
    downstream, forward_error = None, None
    if route.get("forward"):
        try:
            downstream = connect_downstream(route["forward"], request["token"])
        except OSError as err:
            forward_error = f"cannot reach {route['forward']['host']}: {err}"
    stream = Relay(read, downstream)
    answer = receive(root, request["manifest_sha256"], stream, staging)
    cut = stream.read_error  # a stream that only ended early is told by the head
    stream.drain()
    stream.drop()
    if upstream is not None:
        upstream.close()
    if not answer["ok"] and cut:
        answer["upstream_lost"] = True
        answer["error"] = f"{answer['error']} ({cut})"
    answer["relayed_bytes"] = stream.total if downstream is not None else 0
    answer["forward_error"] = forward_error or stream.forward_error
    finished.set()
    os.close(lock)  # before the answer: the head may start the next round at once
    _say(answer)
    return 0 if answer["ok"] else 1


def main(argv):
    if argv[0] == "look":
        _say(look(json.loads(argv[1])))
        return 0
    return relay_main(sys.stdin.buffer)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
