"""Hostfiles and node sets: the cluster inventory every other step starts from.

The hostfile format is DeepSpeed's (`host slots=N` per line, `#` comments), read
strictly: anything DeepSpeed would warn about, guess at or silently drop is an
error here with the file and line. Node-set syntax (`gpu[01-16]`, `a,b,c`) is
ClusterShell's NodeSet. Pure: no I/O except `read_hostfile`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException, RangeSetParseError

from orchestrator.errors import InputFileError, UsageError

# A host name or address as it may appear on a pdsh/ssh command line: no shell
# metacharacters, no whitespace, never starting with '-' (it would read as an option).
_HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*", re.ASCII)
_SLOTS_RE = re.compile(r"slots=([0-9]+)", re.ASCII)
# Refuse node sets that expand to absurd sizes before materialising them.
MAX_NODES = 4096
_NODESET_OPERATORS = frozenset("!&^")
# The `source` of a Hostfile built from a node set rather than read from a file.
NODESET_SOURCE = "<nodes>"


@dataclass(frozen=True)
class HostSlots:
    host: str
    slots: int


@dataclass(frozen=True)
class Hostfile:
    hosts: tuple[HostSlots, ...]
    # Where it came from, for messages; not part of the value.
    source: str | None = field(default=None, compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(entry.host for entry in self.hosts)

    @property
    def total_slots(self) -> int:
        return sum(entry.slots for entry in self.hosts)

    def slots_of(self, host: str) -> int:
        for entry in self.hosts:
            if entry.host == host:
                return entry.slots
        raise KeyError(host)


def host_name_problem(name: str) -> str | None:
    """Why `name` cannot be used as a host name, or None when it can."""
    if not name:
        return "empty host name"
    if _HOST_RE.fullmatch(name) is None:
        return (
            f"host name {name!r} has characters that are not allowed "
            "(only letters, digits, '.', '_' and '-', not starting with '-' or '.')"
        )
    return None


def parse_hostfile(text: str, source: str = "<hostfile>") -> Hostfile:
    """Parse DeepSpeed hostfile text; any bad line is an InputFileError naming it."""
    hosts: list[HostSlots] = []
    first_line: dict[str, int] = {}
    # Lines end at '\n' only, as in DeepSpeed's reader ('\r' is stripped as whitespace).
    for number, raw in enumerate(text.split("\n"), start=1):
        entry = _parse_line(raw, source, number)
        if entry is None:
            continue
        if entry.host in first_line:
            raise InputFileError(
                source,
                f"duplicate host {entry.host!r} (first listed on line {first_line[entry.host]})",
                line=number,
                hint="list each host once; DeepSpeed refuses hostfiles with repeated hosts",
            )
        first_line[entry.host] = number
        hosts.append(entry)
    if not hosts:
        raise InputFileError(
            source,
            "hostfile lists no hosts",
            hint="add one 'HOST slots=N' line per node, e.g. 'gpu01 slots=8' "
            "(or write one with `orch hostfile -w ... --slots N`)",
        )
    return Hostfile(tuple(hosts), source=source)


def _parse_line(raw: str, source: str, number: int) -> HostSlots | None:
    line = raw.split("#", 1)[0].strip()
    if not line:
        return None
    fields = line.split()
    host = fields[0]
    problem = host_name_problem(host)
    if problem is not None:
        raise InputFileError(source, problem, line=number, hint="write one 'HOST slots=N' per line")
    if len(fields) != 2:
        raise InputFileError(
            source,
            f"cannot parse {line!r}: expected 'HOST slots=N'",
            line=number,
            hint=f"write e.g. '{host} slots=8' (slots: processes, usually GPUs, on that host)",
        )
    match = _SLOTS_RE.fullmatch(fields[1])
    if match is None:
        raise InputFileError(
            source,
            f"cannot parse {fields[1]!r} for host {host!r}: expected 'slots=N'",
            line=number,
            hint=f"write e.g. '{host} slots=8'",
        )
    slots = int(match.group(1))
    if slots < 1:
        raise InputFileError(
            source,
            f"host {host!r} has slots={slots}; a host needs at least one slot",
            line=number,
            hint="remove the line, or give the number of GPUs to use on that host",
        )
    return HostSlots(host, slots)


def read_hostfile(path: str | os.PathLike[str]) -> Hostfile:
    """Read and parse a hostfile; a missing or unreadable file is an InputFileError."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise InputFileError(
            name,
            "hostfile not found",
            hint="check the path, or write one with `orch hostfile -w ... --slots N -o FILE`",
        ) from None
    except IsADirectoryError:
        raise InputFileError(name, "is a directory, not a hostfile") from None
    except UnicodeDecodeError as err:
        raise InputFileError(name, f"not a text file ({err.reason})") from None
    except OSError as err:
        raise InputFileError(name, f"cannot read hostfile: {err.strerror}") from None
    return parse_hostfile(text, source=name)


def render_hostfile(hostfile: Hostfile) -> str:
    """DeepSpeed hostfile text: one 'host slots=N' line per host, in order."""
    for entry in hostfile.hosts:
        problem = host_name_problem(entry.host)
        if problem is not None:
            raise UsageError(problem)
        if entry.slots < 1:
            raise UsageError(f"host {entry.host!r} has slots={entry.slots}; need at least 1")
    if not hostfile.hosts:
        raise UsageError("a hostfile needs at least one host")
    return "".join(f"{entry.host} slots={entry.slots}\n" for entry in hostfile.hosts)


def make_hostfile(
    names: Iterable[str], slots: int | Iterable[int], source: str = NODESET_SOURCE
) -> Hostfile:
    """A Hostfile from host names and one slot count (or one per host), validated; `source`
    names where they came from in messages."""
    names = list(names)
    counts = [slots] * len(names) if isinstance(slots, int) else list(slots)
    if len(counts) != len(names):
        raise UsageError(f"{len(names)} hosts but {len(counts)} slot counts")
    hostfile = Hostfile(tuple(HostSlots(n, c) for n, c in zip(names, counts, strict=True)))
    # Same checks as parsing: round-trip the text so both paths agree.
    return parse_hostfile(render_hostfile(hostfile), source=source)


def is_node_count(value: object) -> bool:
    """`4` or '4': a count of nodes (-N, a recipe's slurm/recovery `nodes:`), never a node set
    (-w, `nodelist:`): no node is called 4, which reads as an address."""
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    return isinstance(value, str) and value.strip().isascii() and value.strip().isdigit()


def expand_nodeset(expr: str) -> list[str]:
    """Expand a node set (`gpu[01-04]`, `a,b,c`) into host names.

    The order written is kept (the first host is the main node), duplicates
    dropped. Expressions with ClusterShell operators (`!`, `&`, `^`) come out in
    NodeSet's sorted order.
    """
    text = expr.strip()
    if not text:
        raise UsageError("empty node set", hint="give nodes like 'gpu[01-04]' or 'a,b,c'")
    if "@" in text:
        raise UsageError(
            f"node set {expr!r}: node groups ('@group') are not supported",
            hint="list the nodes, e.g. 'gpu[01-04]'",
        )
    parts = [text] if _NODESET_OPERATORS & set(text) else _split_top_level(text)
    names: list[str] = []
    seen: set[str] = set()
    for part in parts:
        for name in _expand_part(part, expr):
            if name not in seen:
                seen.add(name)
                names.append(name)
    if not names:
        raise UsageError(f"node set {expr!r} is empty")
    return names


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: 'a[1,2],b' -> ['a[1,2]', 'b']."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _expand_part(part: str, expr: str) -> list[str]:
    try:
        # No group resolver: a wildcard (`n*`) would run the shell commands of ClusterShell's
        # group sources and expand to whatever hosts they list.
        nodeset = NodeSet(part, resolver=RESOLVER_NOGROUP)
        size = len(nodeset)
        if size > MAX_NODES:
            raise UsageError(f"node set {expr!r} has {size} nodes (at most {MAX_NODES})")
        names = list(nodeset)
    except (NodeSetException, RangeSetParseError, ValueError, TypeError, IndexError) as err:
        raise UsageError(
            f"cannot parse node set {expr!r}: {err}",
            hint="use ClusterShell syntax, e.g. 'gpu[01-16]', 'node[1-4,7]' or 'a,b,c'",
        ) from None
    if not names:
        raise UsageError(f"node set {expr!r}: {part!r} names no nodes")
    for name in names:
        problem = host_name_problem(name)
        if problem is not None:
            raise UsageError(f"node set {expr!r}: {problem}")
    return names


def fold_nodeset(names: Iterable[str]) -> str:
    """The shortest node-set text for `names` (`gpu01,gpu02` -> `gpu[01-02]`)."""
    names = list(names)
    for name in names:
        problem = host_name_problem(name)
        if problem is not None:
            raise UsageError(problem)
    return str(NodeSet.fromlist(names))


def nodes_text(nodes: Sequence[str]) -> str:
    """Many node names in the width of a table cell (`node[01-32,40]`): words that are no
    host names (`the head`) first, names fold_nodeset refuses as they are."""
    plain = [n for n in nodes if " " in n]
    names = [n for n in nodes if " " not in n]
    try:
        folded = fold_nodeset(names) if names else ""
    except Exception:  # a name that cannot be folded is shown, not refused: this is for reading
        folded = ",".join(names)
    return ", ".join([*plain, folded] if folded else plain)


def filter_hosts(
    hostfile: Hostfile, include: str | None = None, exclude: str | None = None
) -> Hostfile:
    """Apply DeepSpeed's include/exclude syntax: `NODE[:SLOT[,SLOT...]][@NODE...]`.

    A NODE without slots may be a node set (`gpu[01-04]`). Slot lists become slot
    counts; a host left with no slot is dropped. Names and slots must exist.
    """
    if include and exclude:
        raise UsageError(
            "include and exclude cannot be used together",
            hint="give either --include or --exclude, as with DeepSpeed",
        )
    if not include and not exclude:
        return hostfile
    spec = include or exclude or ""
    wanted = _parse_filter(spec, hostfile)
    if include:
        hosts = [
            HostSlots(entry.host, len(wanted[entry.host]) or entry.slots)
            for entry in hostfile.hosts
            if entry.host in wanted
        ]
    else:
        hosts = []
        for entry in hostfile.hosts:
            if entry.host not in wanted:
                hosts.append(entry)
                continue
            removed = wanted[entry.host]
            left = entry.slots - len(removed) if removed else 0
            if left > 0:
                hosts.append(HostSlots(entry.host, left))
    for entry in hostfile.hosts:
        _check_first_slots(entry, wanted.get(entry.host), spec, include=bool(include))
    if not hosts:
        raise UsageError(
            f"filter {spec!r} leaves no hosts of {_where(hostfile)}",
            hint="check the include/exclude expression against the hostfile",
        )
    return Hostfile(tuple(hosts), source=hostfile.source)


def job_nodes(pool: Hostfile, nodes: int | None, min_nodes: int | None) -> Hostfile:
    """The first `nodes` of the pool, in order (all of it: None); the rest are spares. A
    count the pool cannot give, or a `min_nodes` above it, is refused with the fix."""
    have = len(pool.hosts)
    if nodes is not None and nodes > have:
        raise UsageError(
            f"--nodes {nodes}: {_where(pool)} has {have} node(s) ({fold_nodeset(pool.names)})",
            f"ask for at most {have} (--nodes {have}), or add nodes to the hostfile",
        )
    wanted = have if nodes is None else nodes
    if min_nodes is not None and min_nodes > wanted:
        said = f"--nodes {nodes}" if nodes is not None else f"the {have} node(s) of {_where(pool)}"
        raise UsageError(
            f"--min-nodes {min_nodes} is above {said}: the job can never run that many",
            f"give --min-nodes {wanted} or less",
        )
    return Hostfile(pool.hosts[:wanted], source=pool.source)


def _check_first_slots(entry: HostSlots, named: set[int] | None, spec: str, *,
                       include: bool) -> None:  # fmt: skip
    """A node's ranks run on its first GPUs (0..k-1) on every launcher (DeepSpeed's
    per-node launcher sets CUDA_VISIBLE_DEVICES itself): a filter that keeps other slots
    would silently run on the wrong GPUs, so it is refused."""
    if not named:
        return
    kept = named if include else set(range(entry.slots)) - named
    if kept and kept != set(range(len(kept))):
        slots = ",".join(map(str, sorted(kept)))
        raise UsageError(
            f"filter {spec!r} keeps slots {slots} of {entry.host}: orch runs a node's ranks "
            f"on its first slots (0..{len(kept) - 1}), not on these",
            hint=f"to run on GPUs {slots}, give --env CUDA_VISIBLE_DEVICES={slots} with "
            f"--nproc-per-node {len(kept)} and --launcher torchrun or standard",
        )


def _parse_filter(spec: str, hostfile: Hostfile) -> dict[str, set[int]]:
    """Map host -> selected slot indices (empty set: the whole host)."""
    wanted: dict[str, set[int]] = {}
    for item in spec.split("@"):
        if not item.strip():
            raise UsageError(f"filter {spec!r} has an empty NODE between '@'")
        node_text, has_slots, slot_text = item.partition(":")
        hosts = expand_nodeset(node_text)
        slots = _parse_slots(slot_text, spec) if has_slots else set()
        for host in hosts:
            if host not in hostfile.names:
                raise UsageError(
                    f"filter {spec!r}: host {host!r} is not in {_where(hostfile)}",
                    hint="hosts: " + fold_nodeset(hostfile.names),
                )
            for slot in slots:
                if slot >= hostfile.slots_of(host):
                    raise UsageError(
                        f"filter {spec!r}: host {host!r} has no slot {slot} "
                        f"(slots 0..{hostfile.slots_of(host) - 1})"
                    )
            if host in wanted and (not wanted[host] or not slots):
                wanted[host] = set()
            else:
                wanted[host] = wanted.get(host, set()) | slots
    return wanted


def _parse_slots(text: str, spec: str) -> set[int]:
    items = text.split(",")
    if not all(re.fullmatch(r"[0-9]+", item, re.ASCII) for item in items):
        raise UsageError(
            f"filter {spec!r}: slots {text!r} are not a list of numbers",
            hint="write e.g. 'node1:0,1@node2'",
        )
    return {int(item) for item in items}


def _where(hostfile: Hostfile) -> str:
    return hostfile.source or "the hostfile"


def slot_listing(hostfile: Hostfile) -> str:
    """ "a1=2, a2=1, a3=2": each host's slots, for messages."""
    return ", ".join(f"{e.host}={e.slots}" for e in hostfile.hosts)


def ranks_per_node(hostfile: Hostfile, requested: int | None = None) -> tuple[int, ...]:
    """Ranks to start on each node, in order: `requested` on every node (checked against
    the slots), else each node's own slot count, even when they differ."""
    if requested is None:
        return tuple(entry.slots for entry in hostfile.hosts)
    return (processes_per_node(hostfile, requested),) * len(hostfile.hosts)


def processes_per_node(hostfile: Hostfile, requested: int | None = None) -> int:
    """Processes to start on each node: `requested`, or the hosts' (equal) slot count.

    accelerate and torchrun start the same number on every machine, so uneven
    slots need an explicit count that fits every host.
    """
    if requested is None:
        counts = {entry.slots for entry in hostfile.hosts}
        if len(counts) != 1:
            raise UsageError(
                f"hosts of {_where(hostfile)} have different slot counts "
                f"({slot_listing(hostfile)})",
                hint="every node runs the same number of processes: set the processes per "
                "node (e.g. nproc_per_node) to at most the smallest slot count",
            )
        return counts.pop()
    if requested < 1:
        raise UsageError(f"processes per node must be at least 1, not {requested}")
    short = [entry for entry in hostfile.hosts if entry.slots < requested]
    if short:
        raise UsageError(
            f"{requested} processes per node, but host {short[0].host!r} of {_where(hostfile)} "
            f"has only {short[0].slots} slots",
            hint="lower the processes per node or fix the hostfile",
        )
    return requested
