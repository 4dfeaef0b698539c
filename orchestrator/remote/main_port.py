"""On node 0: whether what listens on the job's main port is the job's own.

STANDARD LIBRARY ONLY (shipped inline beside the agent, plan/agent_command.py).

The workers' agents release their launchers as soon as anything answers on node 0's main
port, and their ranks rendezvous with whatever listens there: another user who binds the
port first becomes the job's unauthenticated rendezvous endpoint (torchrun on node 0, told it
hosts the store, fails when its bind does rather than become a client). Node 0's agent looks
before starting its launcher (the port must be free, or the job's) and watches it afterwards:
a listener on the port is the job's when its uid is the agent's and a process of the job on
this machine holds the socket (/proc/<pid>/fd/* -> socket:[inode]). Otherwise the job fails
naming the port and the listener's owner (the uid column of /proc/net/tcp{,6}: another
user's process cannot be looked into, its socket's owner can).

What this cannot prevent: a worker may reach a foreign listener in the moments before node 0
sees it; the job is then torn down, nothing of it runs on.

Every reader takes the /proc directory to read (`proc`), so the rules are tested on
fabricated trees; the parsers are tested on values.
"""

from __future__ import annotations

import os
import pwd
import re
import socket
import struct
import sys
import threading
from dataclasses import dataclass

try:  # on a node, loaded beside this program
    import orch_procs as procs
except ImportError:
    from orchestrator.remote import procs

PROC = procs.PROC
LISTEN = 0x0A  # TCP_LISTEN, the `st` column of /proc/net/tcp
TABLES = ("net/tcp", "net/tcp6")
WATCH_S = 0.1  # until the launcher's listener is confirmed: the workers connect at once
WATCH_AFTER_S = 1.0  # afterwards, for a listener added beside it (another family's)
_SOCKET_LINK = re.compile(r"socket:\[(\d+)\]")
_FIX = "launch again (orch picks another free port) or give a free one with --main-port"


@dataclass(frozen=True)
class TcpSocket:
    """One line of /proc/net/tcp or tcp6."""

    address: str  # the local address, as text
    port: int
    state: int
    uid: int  # the socket's owner
    inode: int

    @property
    def listening(self) -> bool:
        return self.state == LISTEN


# ----- the rules, on values ---------------------------------------------------------
def parse_address(text: str, byteorder: str = sys.byteorder) -> tuple[str, int]:
    """/proc/net/tcp's `HEX:PORT`: the address is the kernel's 32-bit words printed as
    integers of the node's byte order (8 hex digits for IPv4, 32 for IPv6), the port is in
    hex as a number."""
    hex_address, _, hex_port = text.partition(":")
    words = [int(hex_address[i : i + 8], 16) for i in range(0, len(hex_address), 8)]
    order = "<" if byteorder == "little" else ">"
    raw = struct.pack(f"{order}{len(words)}I", *words)
    family = 4 if len(raw) == 4 else 6
    address = ".".join(map(str, raw)) if family == 4 else socket.inet_ntop(socket.AF_INET6, raw)
    return address, int(hex_port, 16)


def parse_tcp_line(line: str, byteorder: str = sys.byteorder) -> TcpSocket | None:
    """One socket from a line of /proc/net/tcp{,6}; None for the header or a line that is
    not one (`sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...`)."""
    fields = line.split()
    if len(fields) < 10 or not fields[0].rstrip(":").isdigit():
        return None
    try:
        address, port = parse_address(fields[1], byteorder)
        return TcpSocket(address, port, int(fields[3], 16), int(fields[7]), int(fields[9]))
    except (ValueError, struct.error):
        return None


def socket_inode(link: str) -> int | None:
    """The inode a /proc/<pid>/fd link names when it is a socket (`socket:[12345]`)."""
    found = _SOCKET_LINK.fullmatch(link)
    return int(found.group(1)) if found else None


def strangers(listeners: list[TcpSocket], uid: int, held: set[int]) -> list[TcpSocket]:
    """The listeners that are not the job's: another user's, or not held by the job."""
    return [s for s in listeners if s.uid != uid or s.inode not in held]


def user_shown(uid: int) -> str:
    """`alice (uid 1000)`, or `uid 1000` where the node has no name for it."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def taken_message(port: int, node: str, stranger: TcpSocket, uid: int, started: bool) -> str:
    """What the job's error says: the port, the listener's owner, and what it means."""
    owner = user_shown(stranger.uid)
    whose = "another process of yours" if stranger.uid == uid else "another user's process"
    when = "took the port before this job's launcher" if started else "already listens there"
    return (
        f"main port {port} on {node} is not this job's: {whose}, owned by {owner}, {when} "
        f"({stranger.address}:{port}), and the job's ranks would rendezvous with it; "
        f"{_FIX}"
    )


# ----- reading /proc ----------------------------------------------------------------
def read_sockets(proc: str = PROC) -> list[TcpSocket]:
    """Every TCP socket of this node's network namespace, IPv4 and IPv6."""
    found = []
    for table in TABLES:
        try:
            with open(f"{proc}/{table}", encoding="ascii", errors="replace") as handle:
                lines = handle.readlines()
        except OSError:  # no IPv6 on this node
            continue
        found += [s for s in map(parse_tcp_line, lines) if s is not None]
    return found


def listeners_on(port: int, proc: str = PROC) -> list[TcpSocket]:
    return [s for s in read_sockets(proc) if s.port == port and s.listening]


def socket_inodes(pid: int, proc: str = PROC) -> set[int]:
    """The sockets a process holds open (empty when it is gone or not this user's)."""
    fd_dir = f"{proc}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return set()
    found = set()
    for name in names:
        try:
            inode = socket_inode(os.readlink(f"{fd_dir}/{name}"))
        except OSError:  # closed meanwhile
            continue
        if inode is not None:
            found.add(inode)
    return found


def job_sockets(job_id: str, uid: int, proc: str = PROC) -> set[int]:
    """The sockets held by this user's processes of the job on this machine, whichever node
    of the job they were started for (where nodes share a kernel, another node's launcher
    may be the one that bound the port)."""
    held: set[int] = set()
    for pid in procs.job_pids(job_id, None, proc, uid):
        held |= socket_inodes(pid, proc)
    return held


def find_stranger(port: int, job_id: str, uid: int, proc: str = PROC) -> TcpSocket | None:
    """A listener on the port that is not the job's, or None. Another user's is one at once;
    a socket of this user's not held by the job is looked at twice, since a socket is held
    before it listens: one that stopped listening meanwhile was no rendezvous."""
    listeners = listeners_on(port, proc)
    foreign = [s for s in listeners if s.uid != uid]
    if foreign or not listeners:
        return foreign[0] if foreign else None
    unheld = strangers(listeners, uid, job_sockets(job_id, uid, proc))
    if not unheld:
        return None
    still = {s.inode for s in listeners_on(port, proc)}
    return next((s for s in unheld if s.inode in still), None)


def check_before_start(port: int, job_id: str, node: str, uid: int,
                       proc: str = PROC) -> str | None:  # fmt: skip
    """Before node 0's launcher starts: why the main port cannot be the job's, or None."""
    stranger = find_stranger(port, job_id, uid, proc)
    return None if stranger is None else taken_message(port, node, stranger, uid, False)


class Watch:
    """After node 0's launcher started: looks at the main port until the job ends; `problem`
    is set (and the watch ends) once a listener there is not the job's."""

    def __init__(self, port: int, job_id: str, node: str, uid: int, proc: str = PROC) -> None:
        self.port, self.job_id, self.node, self.uid, self.proc = port, job_id, node, uid, proc
        self.problem: str | None = None
        self._confirmed: set[int] = set()  # the job's listeners already looked into
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)

    def look(self) -> str | None:
        """One look: the problem, or None (the port not listening yet, or the job's)."""
        listeners = listeners_on(self.port, self.proc)
        if all(s.inode in self._confirmed and s.uid == self.uid for s in listeners):
            return None
        stranger = find_stranger(self.port, self.job_id, self.uid, self.proc)
        if stranger is not None:
            return taken_message(self.port, self.node, stranger, self.uid, True)
        self._confirmed |= {s.inode for s in listeners}
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.problem = self.look()
            except OSError:  # /proc unreadable: nothing to confirm either way
                return
            if self.problem:
                return
            self._stop.wait(WATCH_AFTER_S if self._confirmed else WATCH_S)
