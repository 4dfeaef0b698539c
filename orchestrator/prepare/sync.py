"""`--sync`: copy the head's working directory to every node before a launch.

For clusters without a shared filesystem. Files go over SFTP (one SSH connection
per node, nodes in parallel), or as one tar stream into `tar -x` where the node's sshd
offers no SFTP. What the .gitignore files ignore is skipped (git's rules, through
pathspec: negations and nested .gitignore files included), as are .git and virtual
environments. A file whose size and modification time already match on the node is not
sent again.

A node that already sees the head's directory (a shared filesystem: a marker
file written here is visible there) is left alone: copying a file onto itself
would truncate it.
"""

from __future__ import annotations

import io
import os
import posixpath
import secrets
import shlex
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pathspec import GitIgnoreSpec

from orchestrator.pernode import GroupResult, NodeResult, failed, for_each_node, succeeded
from orchestrator.ssh import (
    NodeSession,
    RemoteProcess,
    SFTPClient,
    SSHError,
    failure_result,
    open_session,
)

ALWAYS_SKIPPED = (".git", ".venv", "venv", "__pycache__", ".orch-sync-marker-*")
_MARKER_PREFIX = ".orch-sync-marker-"


@dataclass(frozen=True)
class SyncedFiles:
    """What --sync did on one node."""

    sent: int = 0  # files copied
    unchanged: int = 0  # files already there
    shared: bool = False  # the node sees the head's directory itself: nothing to copy


class IgnoreRules:
    """What git would ignore under one root: ALWAYS_SKIPPED, then every .gitignore
    from the root down, each relative to its own directory (negations included,
    matched by pathspec's git implementation; a deeper file decides over a higher one)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # (directory relative to the root, its rules), in the order os.walk meets them
        self._specs: list[tuple[str, GitIgnoreSpec]] = [
            ("", GitIgnoreSpec.from_lines(ALWAYS_SKIPPED))
        ]

    def enter(self, directory: str) -> None:
        """Read `directory`/.gitignore (relative to the root, '' for the root) if there is one."""
        gitignore = self.root / directory / ".gitignore"
        if gitignore.is_file():
            lines = gitignore.read_text(errors="replace").splitlines()
            self._specs.append((directory, GitIgnoreSpec.from_lines(lines)))

    def ignored(self, relative: str, is_dir: bool) -> bool:
        """Whether a path (relative to the root, '/'-separated) is ignored."""
        verdict = False
        for base, spec in self._specs:  # root first, then deeper directories
            if base and not relative.startswith(base + "/"):
                continue
            inside = relative[len(base) + 1 :] if base else relative
            decided = spec.check_file(inside + "/" if is_dir else inside).include
            if decided is not None:
                verdict = decided
        return verdict


def files_to_sync(root: Path) -> list[str]:
    """Every file under root that is not ignored, relative and '/'-separated, sorted."""
    rules = IgnoreRules(root)
    found: list[str] = []
    for current, dirs, files in os.walk(root):
        base = Path(current).relative_to(root).as_posix()
        base = "" if base == "." else base
        rules.enter(base)
        # As in git, nothing inside an ignored directory comes back.
        dirs[:] = sorted(d for d in dirs if not rules.ignored(posixpath.join(base, d), True))
        for name in sorted(files):
            relative = posixpath.join(base, name)
            full = Path(current) / name
            if full.is_file() and not full.is_symlink() and not rules.ignored(relative, False):
                found.append(relative)
    return sorted(found)


def _sync_node(
    node: str, root: Path, remote_root: str, files: Sequence[str], marker: str, timeout: float
) -> NodeResult[SyncedFiles]:
    try:
        with open_session(node, timeout=timeout) as session:
            probe = session.run(
                f"test -e {shlex.quote(posixpath.join(remote_root, marker))} && echo shared; "
                f"mkdir -p {shlex.quote(remote_root)}",
                timeout=timeout,
            )
            if b"shared" in probe.stdout:
                return succeeded(node, SyncedFiles(shared=True))
            if probe.exit_code != 0:
                message = probe.stderr.decode(errors="replace").strip()
                return failed(
                    node, f"{node}: cannot create {remote_root}: {message}",
                    "check that the directory's parent exists and is writable on the node",
                )  # fmt: skip
            sftp = session.sftp_if_offered(timeout)
            if sftp is None:  # no SFTP subsystem on the node: one tar stream instead
                return succeeded(node, _copy_by_tar(session, root, remote_root, files, timeout))
            try:
                return succeeded(node, _copy(sftp, root, remote_root, files))
            finally:
                sftp.close()
    except SSHError as err:
        return failure_result(err.failure)
    except OSError as err:
        return failed(node, f"{node}: copy failed ({err})", "check the node's free disk space")


def _copy(sftp: SFTPClient, root: Path, remote_root: str, files: Sequence[str]) -> SyncedFiles:
    made: set[str] = {remote_root}
    sent = unchanged = 0
    for relative in files:
        local = root / relative
        remote = posixpath.join(remote_root, relative)
        info = local.stat()
        try:
            there = sftp.stat(remote)
            if there.st_size == info.st_size and int(there.st_mtime or 0) == int(info.st_mtime):
                unchanged += 1
                continue
        except OSError:
            pass
        _makedirs(sftp, posixpath.dirname(remote), made)
        sftp.put(str(local), remote)
        sftp.chmod(remote, stat.S_IMODE(info.st_mode))
        sftp.utime(remote, (info.st_atime, info.st_mtime))
        sent += 1
    return SyncedFiles(sent=sent, unchanged=unchanged)


# ----- without SFTP: one listing, then one tar stream into `tar -x` on the node ----------
def _remote_listing(session: NodeSession, remote_root: str, timeout: float) -> dict:
    """Path (relative) -> (size, whole-second mtime) of every regular file on the node."""
    command = f"cd -- {shlex.quote(remote_root)} && find . -type f -printf '%s %T@ %P\\0'"
    result = session.run(command, timeout=timeout)
    listing: dict[str, tuple[int, int]] = {}
    for entry in result.stdout.split(b"\0"):
        size, _, rest = entry.partition(b" ")
        mtime, _, name = rest.partition(b" ")
        if size.isdigit() and name:
            listing[name.decode(errors="surrogateescape")] = (int(size), int(float(mtime)))
    return listing


class _ToProcess(io.RawIOBase):
    """A write-only stream into a remote command's stdin."""

    def __init__(self, process: RemoteProcess) -> None:
        self.process = process

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[no-untyped-def]
        self.process.send(bytes(data))
        return len(data)


def _copy_by_tar(
    session: NodeSession, root: Path, remote_root: str, files: Sequence[str], timeout: float
) -> SyncedFiles:
    there = _remote_listing(session, remote_root, timeout)
    changed = []
    for relative in files:
        info = (root / relative).stat()
        if there.get(relative) != (info.st_size, int(info.st_mtime)):
            changed.append(relative)
    if changed:
        # tar keeps each file's mode and modification time, so the next sync skips it.
        process = session.start(f"tar -x -f - -C {shlex.quote(remote_root)}", timeout)
        with tarfile.open(fileobj=_ToProcess(process), mode="w|") as archive:
            for relative in changed:
                archive.add(root / relative, arcname=relative, recursive=False)
        result = process.wait(timeout)
        if result.exit_code != 0:
            said = result.stderr.decode(errors="replace").strip()[-300:]
            raise OSError(f"tar on the node exited {result.exit_code}: {said}")
    return SyncedFiles(sent=len(changed), unchanged=len(files) - len(changed))


def _makedirs(sftp: SFTPClient, directory: str, made: set[str]) -> None:
    if directory in made or not directory:
        return
    _makedirs(sftp, posixpath.dirname(directory), made)
    try:
        sftp.mkdir(directory)
    except OSError:
        sftp.stat(directory)  # it exists already; anything else raises here
    made.add(directory)


def sync_workdir(
    nodes: Sequence[str], local_root: str | os.PathLike[str], remote_root: str,
    *, timeout: float = 30.0, max_parallel: int = 16,
) -> GroupResult[SyncedFiles]:  # fmt: skip
    """Copy local_root to remote_root on every node; one result per node, in order."""
    root = Path(local_root).resolve()
    files = files_to_sync(root)
    marker = f"{_MARKER_PREFIX}{secrets.token_hex(8)}"
    (root / marker).write_text("orch --sync: shared filesystem check\n")
    try:
        return for_each_node(
            nodes,
            lambda node: _sync_node(node, root, remote_root, files, marker, timeout),
            max_parallel=max_parallel,
        )
    finally:
        (root / marker).unlink(missing_ok=True)
