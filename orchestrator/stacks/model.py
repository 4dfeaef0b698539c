"""The ranks' stacks as values: what remote/stacks.py printed on a node, parsed. Pure.

Frames are kept innermost first, as `py-spy dump` prints them. A frame is the user's
code unless its file lies in site-packages, in Python's standard library, or in torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The kinds of failure the node program reports (remote/stacks.py), and the head's own.
NO_PY_SPY, PTRACE, GONE, NO_RANKS, TIMEOUT, OTHER, NO_HANDLER = (
    "no-py-spy", "ptrace", "gone", "no-ranks", "timeout", "other", "no-handler",
)  # fmt: skip
UNREACHABLE, BAD_OUTPUT = "unreachable", "bad-output"

_STDLIB_DIR = re.compile(r"/lib(?:64)?/python\d+(?:\.\d+)?t?/")
_LIBRARY_DIRS = ("/site-packages/", "/dist-packages/")
# Raw samples: `function (file:line)`; files may hold spaces and parentheses.
_RAW_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>.*):(?P<line>\d+)\)$")
_RAW_THREAD = re.compile(r"^thread \((?P<tid>\d+)\)(?:: (?P<name>.*))?$")


def is_library_file(path: str) -> bool:
    """Whether a frame's file is someone else's code: installed packages, the standard
    library, torch (also from a source checkout), or a frozen/builtin module."""
    if not path or path.startswith("<"):
        return True
    if any(part in path for part in _LIBRARY_DIRS) or _STDLIB_DIR.search(path):
        return True
    return path.startswith("torch/") or "/torch/" in path


def short_path(path: str) -> str:
    """A library file from its package (torch/distributed/...), a user's file as it is."""
    for part in _LIBRARY_DIRS:
        if part in path:
            return path.rsplit(part, 1)[1]
    ends = [match.end() for match in _STDLIB_DIR.finditer(path)]
    return path[ends[-1] :] if ends else path


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    @property
    def key(self) -> str:
        """What makes two frames the same, for folding: file:line:function."""
        return f"{self.file}:{self.line}:{self.function}"

    @property
    def where(self) -> str:
        return f"{short_path(self.file)}:{self.line} {self.function}"

    @property
    def is_user(self) -> bool:
        return not is_library_file(self.file)

    def to_json(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.file, "line": self.line}


def innermost_user_frame(frames: Sequence[Frame]) -> Frame | None:
    return next((frame for frame in frames if frame.is_user), None)


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a rank, as `py-spy dump` saw it."""

    name: str
    thread_id: int | None  # the OS thread id; the main thread's is the process id
    idle: bool
    main: bool
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True)
class SampledStack:
    """One distinct stack of a rank's thread and how many samples caught it there."""

    thread_id: int | None
    main: bool
    frames: tuple[Frame, ...]  # innermost first
    count: int


@dataclass(frozen=True)
class RankStacks:
    """One rank: its threads (a dump), its samples (a profile), or why neither."""

    rank: int
    node: str
    pid: int | None
    threads: tuple[ThreadStack, ...] = ()
    samples: tuple[SampledStack, ...] = ()
    error: str | None = None
    kind: str | None = None
    hint: str | None = None
    method: str | None = None  # "py-spy" or "faulthandler": how they were taken

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class NodeReport:
    """What one node answered: its ranks, or why it could not (the others still count)."""

    node: str
    ranks: tuple[RankStacks, ...] = ()
    error: str | None = None
    kind: str | None = None
    hint: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(rank.ok for rank in self.ranks)


def failure_hint(kind: str | None, python: str, job_id: str, pid: int | None = None) -> str:
    """How to fix a failure of one kind, on the node it happened on."""
    hints = {
        NO_PY_SPY: f"install it into the job's environment on that node: "
        f"`{python} -m pip install py-spy` (orch looks beside the job's interpreter, then "
        "on PATH)",
        PTRACE: "py-spy needs ptrace on the ranks: reach the node as root (or with "
        "CAP_SYS_PTRACE), or as the job's user with `sysctl kernel.yama.ptrace_scope=0` "
        "(at 1 a process may only be traced by its ancestors); in a container also add "
        "CAP_SYS_PTRACE (`docker run --cap-add SYS_PTRACE`)",
        GONE: f"the rank ended while it was looked at; see `orch status {job_id}`",
        NO_HANDLER: "without py-spy, orch reads a rank's stack from a faulthandler that "
        "orch-rank registers on SIGUSR2 at start-up: start the script with a plain "
        f"`python` (no -E, -I, -S), or install py-spy: `{python} -m pip install py-spy`",
        NO_RANKS: "the job has no rank running there (it ended, or its ranks have not "
        f"started yet); see `orch status {job_id}`",
        TIMEOUT: "the node or the rank is too busy to answer; try again, or raise --timeout",
        BAD_OUTPUT: f"check that `{python}` (or python3) runs on that node",
    }
    if kind in hints:
        return hints[kind]
    where = f"--pid {pid}" if pid is not None else "--pid PID"
    return f"run `py-spy dump {where}` on that node to see the whole message"


# ----- py-spy's output ----------------------------------------------------------------
def frame_from_dump(frame: Mapping[str, Any]) -> Frame:
    return Frame(
        function=str(frame.get("name") or "?"),
        file=str(frame.get("filename") or frame.get("short_filename") or ""),
        line=int(frame.get("line") or 0),
    )


def thread_from_dump(thread: Mapping[str, Any], pid: int | None) -> ThreadStack:
    """One thread object of `py-spy dump --json`."""
    tid = thread.get("os_thread_id")
    name = str(thread.get("thread_name") or "")
    main = tid == pid if tid is not None and pid is not None else name == "MainThread"
    return ThreadStack(
        name=name,
        thread_id=int(tid) if tid is not None else None,
        idle=not thread.get("active", True),
        main=main,
        frames=tuple(frame_from_dump(frame) for frame in thread.get("frames") or ()),
    )


def _raw_frame(text: str) -> Frame:
    match = _RAW_FRAME.match(text)
    if not match:
        return Frame(function=text, file="", line=0)
    return Frame(match["function"], match["file"], int(match["line"]))


def sample_from_raw(line: str, pid: int | None) -> SampledStack | None:
    """One line of `py-spy record --format raw --threads`: `thread (TID): NAME;outer
    (file:line);...;inner (file:line) COUNT`, outermost first. None if it is not one."""
    stack, _, count = line.rstrip().rpartition(" ")
    if not stack or not count.isdigit():
        return None
    parts = stack.split(";")
    thread_id = None
    thread = _RAW_THREAD.match(parts[0])
    if thread:
        thread_id = int(thread["tid"])
        parts = parts[1:]
    frames = tuple(_raw_frame(part) for part in reversed(parts) if part)
    main = thread_id == pid if thread_id is not None and pid is not None else True
    return SampledStack(thread_id=thread_id, main=main, frames=frames, count=int(count))


# ----- a node's report ---------------------------------------------------------------------
def _rank_from_doc(node: str, item: Mapping[str, Any], python: str, job_id: str) -> RankStacks:
    rank = int(item["rank"])
    pid = int(item["pid"]) if item.get("pid") is not None else None
    method = str(item["method"]) if item.get("method") else None
    if item.get("error"):
        kind = str(item.get("kind") or OTHER)
        return RankStacks(
            rank, node, pid, error=str(item["error"]), kind=kind,
            hint=failure_hint(kind, python, job_id, pid), method=method,
        )  # fmt: skip
    threads = tuple(thread_from_dump(thread, pid) for thread in item.get("threads") or ())
    samples = tuple(
        sample
        for line in item.get("samples") or ()
        if (sample := sample_from_raw(str(line), pid)) is not None
    )
    return RankStacks(rank, node, pid, threads=threads, samples=samples, method=method)


def node_failure(node: str, kind: str, error: str, hint: str) -> NodeReport:
    return NodeReport(node=node, error=error, kind=kind, hint=hint)


def parse_node_report(node: str, text: str, python: str, job_id: str) -> NodeReport:
    """The JSON document remote/stacks.py printed on `node`."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        return node_failure(
            node, BAD_OUTPUT, f"{node}: unreadable answer from the stacks program ({err})",
            failure_hint(BAD_OUTPUT, python, job_id),
        )  # fmt: skip
    return node_report(node, doc, python, job_id)


def node_report(node: str, doc: object, python: str, job_id: str) -> NodeReport:
    """One node's stacks document (remote/stacks.py's report) as a value."""
    try:
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        ranks = tuple(_rank_from_doc(node, item, python, job_id) for item in doc.get("ranks", ()))
    except (ValueError, KeyError, TypeError) as err:
        return node_failure(
            node, BAD_OUTPUT, f"{node}: unreadable answer from the stacks program ({err})",
            failure_hint(BAD_OUTPUT, python, job_id),
        )  # fmt: skip
    if doc.get("error"):
        kind = str(doc.get("kind") or OTHER)
        error = f"{node}: {doc['error']}"
        # A node without py-spy still names the ranks it has, each with the same reason.
        ranks = tuple(RankStacks(r.rank, node, r.pid, error=doc["error"], kind=kind) for r in ranks)
        return NodeReport(node, ranks, error, kind, failure_hint(kind, python, job_id))
    return NodeReport(node=node, ranks=ranks)


def all_ranks(reports: Sequence[NodeReport]) -> list[RankStacks]:
    """Every rank any node named, by rank."""
    return sorted((rank for report in reports for rank in report.ranks), key=lambda r: r.rank)
