"""Pull each node's raw job logs back to the head, whole and verified.

During a job the node agent tees its ranks' raw output into the job's node directory, in
the user's own directory on the node (`/tmp/orch-<uid>/runs/<job-id>/<node>/`, the uid the
node's: the head does not know it, since ssh_config's User may name another account; the
node chooses it as its programs do, remote/owned.py, below the user's ORCH_NODE_ROOT when
that is set). When
the job ends, whatever way it ended, `collect_logs` asks the node for that directory's files
with their sizes and sha256 (the node names the directory in the same answer, after checking
that the user's directory is the user's own), fetches each over SFTP into
`runs/<job-id>/<nodes dir>/<node>/`, checks it, and only then removes the node's copy
(unless keep_remote). The secrets the head masks in its own logs are
masked in them too (logs/redact.py): a rank that prints its token leaves it in its raw
output (a file's size and sha256 stay the node's, as verified). A node that cannot be
reached, or whose files do not arrive whole, is reported with what went wrong and how to
get the files by hand: never skipped silently, never hiding the other nodes.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.logs.redact import redact_file
from orchestrator.nodes.srun import StepError
from orchestrator.nodes.transport import NodeAccess, NodeTransport, SshTransport
from orchestrator.pernode import GroupResult, NodeResult, failed, for_each_node, succeeded
from orchestrator.remote.agent_spec import RUNS_DIR, node_dir_shown
from orchestrator.remote.digest import sha256_of
from orchestrator.remote.owned import shell_user_directory
from orchestrator.ssh import SSHError

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")
_PARTIAL_SUFFIX = ".partial"
_ATTEMPTS = 2  # a file still being written when first fetched gets one more try


@dataclass(frozen=True)
class PulledFile:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class PulledLogs:
    """One node's raw logs, pulled back whole."""

    remote_dir: str
    local_dir: str
    files: tuple[PulledFile, ...] = ()
    remote_removed: bool = False


class _Mismatch(Exception):
    pass


_DIR_LINE = "dir "  # the listing's first line: the node directory, as the node found it


def fetch_command(node: str, job_id: str, transport: NodeTransport | None = None,
                  root: str = "") -> str:  # fmt: skip
    """How a user copies a node's raw logs by hand when orch could not: the node finds its
    own directory (its uid is the node's, not the head's; `root` the user's ORCH_NODE_ROOT);
    through Slurm where the nodes refuse SSH."""
    runs = f'"$u"/{RUNS_DIR}/{shlex.quote(job_id)}'
    tar = f"{shell_user_directory(root)}tar -C {runs} -cf - {shlex.quote(node)}"
    return (transport or SshTransport()).by_hand(node, shlex.quote(tar)) + " | tar -xf -"


def _is_safe(value: str) -> bool:
    # Job ids and node names become parts of a path removed with rm -rf: be strict.
    return bool(_SAFE.fullmatch(value)) and ".." not in value


def _hash_command(job_id: str, node: str, root: str = "") -> str:
    """The node's listing: first `dir <the node directory>`, then one line per regular file,
    "<size> <sha256>  <name>"; exit 3: no such directory; exit 5: the user's directory is not
    the user's own (a link, another user's, writable by others), and nothing in it is read.
    Job id and node name are checked safe words (_is_safe); `root` the user's setting."""
    return (
        f'{shell_user_directory(root)}d="$u/{RUNS_DIR}/{job_id}/{node}"; '
        '[ -e "$u" ] || [ -L "$u" ] || exit 3; '
        '{ [ -d "$u" ] && [ ! -L "$u" ] && [ -O "$u" ] '
        '&& [ -z "$(find "$u" -maxdepth 0 -perm /022)" ]; } || '
        '{ echo "$u is no directory of your own that only you can write: $(ls -ld "$u")" >&2; '
        "exit 5; }; "
        'cd -- "$d" 2>/dev/null || exit 3; '
        f'printf "{_DIR_LINE}%s\n" "$d"; '
        'for f in * .[!.]*; do [ -f "$f" ] || continue; '
        'printf "%s " "$(stat -c %s -- "$f")"; sha256sum -- "$f" || exit 4; done'
    )


def _parse_hashes(stdout: bytes) -> tuple[str | None, dict[str, tuple[int, str]]]:
    """The node directory the listing names (None: it names none) and its files."""
    hashes: dict[str, tuple[int, str]] = {}
    lines = stdout.decode("utf-8", "surrogateescape").splitlines()
    where = None
    if lines and lines[0].startswith(_DIR_LINE):
        where = lines.pop(0)[len(_DIR_LINE):]
    for line in lines:
        size, _, rest = line.partition(" ")
        digest, _, name = rest.partition("  ")
        if size.isdigit() and len(digest) == 64 and name:
            hashes[name] = (int(size), digest)
    return where, hashes


class _NotOwn(Exception):
    """The user's directory on the node is not the user's own: nothing of it is fetched."""


Listing = tuple[str, dict[str, tuple[int, str]]]  # the node directory, its files


def _remote_hashes(session: NodeAccess, job_id: str, node: str, timeout: float,
                   root: str = "") -> Listing | None:  # fmt: skip
    result = session.run(_hash_command(job_id, node, root), timeout=timeout)
    said = result.stderr.decode("utf-8", "replace").strip()[-300:]
    if result.exit_code == 3:
        return None
    if result.exit_code == 5:
        raise _NotOwn(said)
    where, hashes = _parse_hashes(result.stdout)
    if result.exit_code != 0 or where is None:
        raise _Mismatch(
            f"hashing the files in {node_dir_shown(job_id, node, root)} failed "
            f"(exit {result.exit_code}): {said}"
        )
    return where, hashes


def _pull_files(
    session: NodeAccess, remote_dir: str, local_dir: Path,
    hashes: dict[str, tuple[int, str]], timeout: float,
) -> None:  # fmt: skip
    """The regular files the hash listing named (over SFTP, or `cat` where the node's sshd
    has no SFTP subsystem). An empty one is made here, not fetched: a rank that wrote
    nothing on a stream costs no round trip (its hash is still checked)."""
    local_dir.mkdir(parents=True, exist_ok=True)
    for name, (size, _digest) in sorted(hashes.items()):
        target = local_dir / (name + _PARTIAL_SUFFIX)
        if size == 0:
            target.write_bytes(b"")
            continue
        session.download(f"{remote_dir}/{name}", target, timeout)


def _verify(local_dir: Path, hashes: dict[str, tuple[int, str]]) -> list[PulledFile]:
    pulled = []
    for name, (size, digest) in sorted(hashes.items()):
        partial = local_dir / (name + _PARTIAL_SUFFIX)
        got_size = partial.stat().st_size
        got_digest = sha256_of(partial)
        if (got_size, got_digest) != (size, digest):
            raise _Mismatch(
                f"{name}: got {got_size} bytes sha256 {got_digest[:12]}, "
                f"node has {size} bytes sha256 {digest[:12]}"
            )
        pulled.append(PulledFile(name, size, digest))
    for item in pulled:
        os.replace(local_dir / (item.name + _PARTIAL_SUFFIX), local_dir / item.name)
    return pulled


def _collect_over(
    session: NodeAccess, node: str, job_id: str, local_dir: Path, keep_remote: bool,
    timeout: float, secrets: Sequence[str] = (), transport: NodeTransport | None = None,
    root: str = "",
) -> NodeResult[PulledLogs]:  # fmt: skip
    problem = ""
    for _attempt in range(_ATTEMPTS):
        try:
            listed = _remote_hashes(session, job_id, node, timeout, root)
        except _NotOwn as err:
            fix = "remove it (as its owner or root), or chmod go-w it if it is yours"
            return failed(node, f"{node}: raw logs not fetched: {err}", fix)
        if listed is None:
            return failed(
                node,
                f"{node}: no raw logs at {node_dir_shown(job_id, node, root)}",
                "the job never started on this node, or its logs were already removed",
            )
        remote_dir, before = listed
        _pull_files(session, remote_dir, local_dir, before, timeout)
        try:
            after = _remote_hashes(session, job_id, node, timeout, root)
            if after != listed:
                raise _Mismatch("files changed on the node while they were copied")
            files = _verify(local_dir, before)
        except (_Mismatch, _NotOwn) as err:
            problem = str(err)
            continue
        for item in files:
            redact_file(local_dir / item.name, secrets)
        removed = False
        if not keep_remote:
            removed = _remove_remote(session, remote_dir, timeout)
        return succeeded(node, PulledLogs(remote_dir, str(local_dir), tuple(files), removed))
    return failed(
        node,
        f"{node}: raw logs did not arrive whole: {problem}",
        "the node's copy was kept; fetch it by hand: "
        + fetch_command(node, job_id, transport, root),
    )


def _remove_remote(session: NodeAccess, remote_dir: str, timeout: float) -> bool:
    job_dir = os.path.dirname(remote_dir)
    command = (
        f"rm -rf -- {shlex.quote(remote_dir)} && "
        f"{{ rmdir -- {shlex.quote(job_dir)} 2>/dev/null; true; }}"
    )
    return session.run(command, timeout=timeout).exit_code == 0


def collect_node(
    node: str,
    job_id: str,
    dest_root: str | os.PathLike[str],
    *,
    keep_remote: bool = False,
    connect_timeout: float = 10.0,
    timeout: float = 120.0,
    secrets: Sequence[str] = (),
    transport: NodeTransport | None = None,
    node_root: str = "",
) -> NodeResult[PulledLogs]:
    """Fetch one node's raw logs into dest_root/<node>/, `secrets` masked in them; never
    raises for a node problem. `node_root`: the user's ORCH_NODE_ROOT."""
    if not _is_safe(job_id):
        raise UsageError(f"not a job id: {job_id!r}", "see `orch status` for the jobs there are")
    remote_dir = node_dir_shown(job_id, node, node_root)
    local_dir = Path(dest_root) / node
    if not _is_safe(node):
        return failed(
            node,
            f"{node!r}: not a node name orch will build a path from",
            "name nodes by host name, IP or ssh alias (letters, digits, . _ - @)",
        )
    try:
        with (transport or SshTransport()).session(node, timeout=connect_timeout) as session:
            return _collect_over(session, node, job_id, local_dir, keep_remote, timeout,
                                 secrets, transport, node_root)  # fmt: skip
    except SSHError as err:
        hint = f"{err.failure.hint}; its logs stay on the node in {remote_dir}"
        return failed(node, err.failure.message, hint, err.failure.kind)
    except StepError as err:
        hint = f"{err.result.hint}; its logs stay on the node in {remote_dir}"
        return failed(node, str(err), hint, err.result.kind)
    except (OSError, EOFError) as err:  # SFTP or the connection failed mid-way
        return failed(
            node,
            f"{node}: fetching {remote_dir} failed ({type(err).__name__}: {err})",
            "its logs stay on the node; fetch them by hand: "
            + fetch_command(node, job_id, transport, node_root),
        )


def collect_logs(
    nodes: Sequence[str],
    job_id: str,
    dest_root: str | os.PathLike[str],
    *,
    keep_remote: bool = False,
    connect_timeout: float = 10.0,
    timeout: float = 120.0,
    max_parallel: int = 16,
    secrets: Sequence[str] = (),
    transport: NodeTransport | None = None,
    node_root: str = "",
) -> GroupResult[PulledLogs]:
    """Every node's raw logs, in parallel; one result per node, in order."""
    def one(node: str) -> NodeResult[PulledLogs]:
        return collect_node(
            node, job_id, dest_root, keep_remote=keep_remote,
            connect_timeout=connect_timeout, timeout=timeout, secrets=secrets,
            transport=transport, node_root=node_root,
        )  # fmt: skip

    return for_each_node(nodes, one, max_parallel=max_parallel)


class LogCollector:
    """Pulls nodes' raw logs in the background, each as soon as it is started: the job's
    runner starts a node the moment its agent has exited (its logs are complete), while
    the rest of the job ends, and the others at the end. At most `max_parallel` nodes at a
    time, each in a thread of its own. Nothing raises: every node ends with a result."""

    def __init__(self, job_id: str, dest_root: str | os.PathLike[str], *,
                 keep_remote: bool, connect_timeout: float, timeout: float,
                 max_parallel: int = 16, secrets: Sequence[str] = (),
                 transport: NodeTransport | None = None, node_root: str = "") -> None:  # fmt: skip
        self.job_id, self.dest_root, self.secrets = job_id, dest_root, tuple(secrets)
        self.transport, self.node_root = transport, node_root
        self.keep_remote, self.connect_timeout, self.timeout = keep_remote, connect_timeout, timeout
        self.max_parallel = max_parallel
        self._slots = threading.Semaphore(max_parallel)
        self._threads: dict[str, threading.Thread] = {}
        self._results: dict[str, NodeResult[PulledLogs]] = {}

    def start(self, node: str) -> None:
        if node not in self._threads:
            thread = threading.Thread(target=self._one, args=(node,), daemon=True)
            self._threads[node] = thread
            thread.start()

    @property
    def nodes(self) -> set[str]:
        return set(self._threads)

    def _one(self, node: str) -> None:
        with self._slots:
            try:
                result = collect_node(
                    node, self.job_id, self.dest_root, keep_remote=self.keep_remote,
                    connect_timeout=self.connect_timeout, timeout=self.timeout,
                    secrets=self.secrets, transport=self.transport, node_root=self.node_root,
                )  # fmt: skip
            except Exception as err:  # the job is over: a fetch problem is only reported
                result = failed(
                    node, f"{node}: pulling the raw logs failed ({type(err).__name__}: {err})",
                    f"fetch them by hand: {self.by_hand(node)}",
                )  # fmt: skip
        self._results[node] = result

    def by_hand(self, node: str) -> str:
        """How a user fetches the node's raw logs when orch could not."""
        return fetch_command(node, self.job_id, self.transport, self.node_root)

    def pull_all(self, hosts: Sequence[str], unreached: set[str]) -> dict[str, str]:
        """Every host's raw logs pulled back ("ok" or why not), whatever way the job ended;
        a host in `unreached` (the teardown could not reach it just now) is not tried unless
        already started: it would only cost another timeout."""
        skipped = unreached - self.nodes
        for node in hosts:
            if node not in skipped:
                self.start(node)  # a node already started is not started again
        outcome = {n: r.why for n, r in self.results().items()}
        for node in skipped:
            where = node_dir_shown(self.job_id, node, self.node_root)
            outcome[node] = (
                f"{node}: not tried, the teardown could not reach it; its logs stay on the "
                f"node in {where}; fetch them by hand: {self.by_hand(node)}"
            )
        return {h: outcome[h] for h in hosts}

    def results(self) -> dict[str, NodeResult[PulledLogs]]:
        """Every started node's result. Bounded: each wave of `max_parallel` nodes still
        running gets a node's connect timeout plus its step timeout."""
        waiting = sum(1 for node in self._threads if node not in self._results)
        waves = max(1, -(-waiting // self.max_parallel))
        wait = (self.connect_timeout + self.timeout) * waves
        deadline = time.monotonic() + wait
        for thread in self._threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        done = dict(self._results)
        for node in self._threads:
            if node not in done:
                by_hand = self.by_hand(node)
                done[node] = failed(
                    node, f"{node}: its raw logs were still coming back after {wait:g}s",
                    f"they stay on the node; fetch them by hand: {by_hand}",
                )  # fmt: skip
        return done
