"""`orch env push` on a node: STANDARD LIBRARY ONLY, shipped inline (`python -c`), with
environment.py loaded beside it (as orch_environment). Run with the base interpreter the
head's environment was made from, so what it reports is what the environment will run on.

Two steps, each one JSON argument and one JSON line printed:

- look: {"root", "marker"}: is the head's directory seen here (the marker the head wrote
  in it: a shared filesystem, left alone), this interpreter's version, ABI and platform,
  the free disk where the root is (or would be), the processes running from the root,
  and the manifest of what the root holds now (zlib + base64 JSON: relative path ->
  [kind, size, sha256 or link target, mode]). Hashes of files whose size and mtime match
  the manifest of the last push are taken from it rather than read again.
- receive: {"root", "remove", "send", "dirs"} as the first line on stdin (it can be larger
  than a command line may be), then a tar stream: builds the new environment in a sibling
  directory: the current files are hard links, but those removed or replaced; what is sent
  arrives in the tar stream, each file checked against its sha256; then the two are swapped
  in one rename (renameat2 RENAME_EXCHANGE), so a process starting meanwhile sees the old
  environment or the new one, never half of each; the old one is then removed. Anything
  wrong (a hash, a missing file, SIGHUP or SIGTERM from the head going away) removes the
  sibling and leaves the root as it was.
"""

import base64
import ctypes
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import zlib

try:  # on a node, loaded beside this program
    import orch_environment as environment
except ImportError:
    from orchestrator.remote import environment

MANIFEST_NAME = ".orch-manifest.json"
STAGING_INFIX = ".orch-new-"
SKIPPED_DIRS = ("__pycache__",)
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
        for chunk in iter(lambda: handle.read(1 << 20), b""):
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
            if rel == MANIFEST_NAME or name.endswith(".pyc"):
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


def _recorded(root):
    try:
        with open(os.path.join(root, MANIFEST_NAME)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def _free_bytes(path):
    probe = path
    while not os.path.exists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    stats = os.statvfs(probe)
    return stats.f_bavail * stats.f_frsize


def _running_from(root):
    """pids running from the root: their executable is there, or the interpreter they were
    started as (a venv's bin/python is a link to its base interpreter)."""
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
            found.append(int(name))
    return found


def look(request):
    root = request["root"]
    exists = os.path.isdir(root)
    shared = exists and os.path.exists(os.path.join(root, request["marker"]))
    answer = {
        "shared": shared,
        "exists": exists,
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
        self.remove()
        os._exit(128 + signum)

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
        for chunk in iter(lambda: source.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != want[2]:
        raise ValueError(f"{member.name}: sha256 does not match what the head sent")
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


def build(staging, root, request, stream):
    """The new environment in `staging`: the root's files but those removed or replaced,
    the head's new directories, then what the tar stream brings. Returns files received."""
    send = request["send"]
    _copy_tree(staging, root, set(request["remove"]) | set(send))
    for rel, mode in sorted(request["dirs"].items()):
        os.makedirs(os.path.join(staging, _safe(rel)), exist_ok=True)
        os.chmod(os.path.join(staging, rel), mode | 0o700)
    received = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            rel = _safe(member.name)
            want = send.get(rel)
            target = os.path.join(staging, rel)
            if want is None:
                raise ValueError(f"{rel}: the head sent what it did not announce")
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)  # a directory the head has as a file or link now
            if member.issym() and want[0] == "l":
                os.symlink(member.linkname, target)
            elif member.isfile() and want[0] == "f":
                _receive_file(tar, member, target, want)
            else:
                raise ValueError(f"{rel}: not what the head announced")
            received += 1
    missing = [rel for rel in send if not os.path.lexists(os.path.join(staging, rel))]
    if missing:
        raise ValueError(f"{len(missing)} file(s) never arrived, e.g. {missing[0]}")
    return received


def with_mtimes(root, found):
    """The files of a manifest with their mtimes: what `manifest(root, previous)` needs to
    hash only the files that changed since."""
    return {
        rel: [*entry[:4], os.lstat(os.path.join(root, rel)).st_mtime_ns]
        for rel, entry in found.items()
        if entry[0] == "f"
    }


def _record(staging, previous):
    """The manifest of the new root, with mtimes, so the next look hashes only what changed
    (files kept as hard links keep their mtime, and their hash comes from `previous`)."""
    recorded = with_mtimes(staging, manifest(staging, previous))
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


def receive(request, stream, on_signals=False):
    root = request["root"]
    for stale in _stale_siblings(root):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Staging(root)
    if on_signals:
        staging.on_signals()
    try:
        received = build(staging.path, root, request, stream)
        _record(staging.path, _recorded(root))
        old = exchange(staging.path, root)
    except (OSError, ValueError, tarfile.TarError) as err:
        staging.remove()
        return {"ok": False, "error": str(err)}
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return {"ok": True, "received": received, "fingerprint": _fingerprint(root)}


def _stale_siblings(root):
    parent, name = os.path.split(root)
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return []
    return [os.path.join(parent, n) for n in names if n.startswith(name + STAGING_INFIX)]


def main(argv):
    if argv[0] == "look":
        print(json.dumps(look(json.loads(argv[1]))), flush=True)
        return 0
    stream = sys.stdin.buffer
    answer = receive(json.loads(stream.readline()), stream, on_signals=True)
    print(json.dumps(answer), flush=True)
    return 0 if answer["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
