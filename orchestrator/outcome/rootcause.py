"""Which rank's traceback to show first when a distributed job fails.

When one rank raises (say `ValueError: bad batch`), every other rank then fails too: gloo
loses its peer, NCCL's watchdog times out, torchrun tears the rest down with SIGTERM and
reports `ChildFailedError`. Those cascade tracebacks often arrive *before* the real one,
so time order alone picks the wrong one. This module finds each rank's last Python
traceback, marks the cascades, and puts the real failure first. Pure: values in, values out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_BLOCK_LINES = 200  # a 5000-frame recursion must not flood the report
HEAD_LINES = 20  # kept from the top of a capped block: where the failure started
MAX_MESSAGE_LINES = 20  # continuation lines of one exception message (C++ frames, reports)

TRACEBACK_HEADER = "Traceback (most recent call last):"
CHAIN_HEADERS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)

# PyTorch (since PR #118190) prints each rank's lines as "[rank3]: ..." or "[rank3]:[W...".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
# Python 3.13 colours tracebacks when it believes it writes to a terminal.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# An exception line is always `qualified.Name` alone or followed by ":".
_EXCEPTION_LINE = re.compile(r"^[^\W\d][\w.]*(?::|$)")
_LOG_RECORD = re.compile(
    r"^(?:"
    r"\[[IWEF]\d*\s"  # c10 logging: [W509 12:00:00.1 ProcessGroupNCCL.cpp:1168], [E socket.cpp:1]
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d"  # glog, torch elastic since 2.3: W0509 12:00:00.123 42 api.py:1]
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]*:"  # Python logging's default format
    r"|\[?\d{4}-\d\d-\d\d[ T_]\d\d:\d\d"  # timestamped records: [2024-05-09 12:00:00,123] ...
    r"|\S+:\d+:\d+ \[\d+\] NCCL "  # NCCL_DEBUG: node0:1234:1290 [0] NCCL INFO ...
    r")"
)

# Exception types that only ever follow another failure: a dead peer, a teardown signal.
CASCADE_TYPES = frozenset(
    {
        "KeyboardInterrupt",
        "SignalException",  # torch elastic: "Process 4012 got signal: 15" from the teardown
        "ChildFailedError",  # torchrun's summary on the launcher
        "DistBackendError",
        "DistNetworkError",
        "DistStoreError",  # the TCPStore lives in rank 0: it goes when rank 0 goes
        "RendezvousClosedError",  # another agent closed the rendezvous after its failure
        "BrokenPipeError",
        "ConnectionResetError",
        "ConnectionAbortedError",
    }
)
# Messages saying the peer went away or the collective was abandoned (lower case).
_CASCADE_MESSAGE = re.compile(
    r"connection closed by (?:remote )?peer"
    r"|connection reset by peer"
    r"|broken pipe"
    r"|watchdog caught collective operation timeout"
    r"|watchdog thread terminated"
    r"|processgroupnccl.*abort"
    r"|nccl communicator was aborted"
    r"|some nccl operations have failed or timed out"
    r"|remote process exit"
    r"|ncclremoteerror"
    r"|timed out waiting \d+ms for (?:recv|send) operation"  # gloo: the peer never sent
    r"|killed by signal: terminated"  # a DataLoader worker hit by the teardown's SIGTERM
)
# Only a message about the communication backend may borrow markers from the rest of its
# block: "Connection reset by peer" in an unrelated chained HTTP error says nothing.
_BACKEND_MESSAGE = re.compile(r"nccl|gloo|c10d|processgroup|torch\.distributed")


@dataclass(frozen=True)
class RankTraceback:
    rank: int
    lines: tuple[str, ...]  # the traceback block as printed (rank prefix kept), capped
    exception: str  # the final exception line, prefix stripped, e.g. "ValueError: bad batch"
    cascade: bool  # a consequence of another rank's failure (see is_cascade)
    order: int  # when the rank failed relative to the others, lower = earlier


@dataclass(frozen=True)
class _Part:
    """One "Traceback ..." of a chain: the line numbers it keeps, and its exception line."""

    kept: tuple[int, ...]
    exception: int
    end: int  # one past its last message line


def _text(line: str) -> str:
    """The line as analysed: no rank prefix, no colour, no trailing blanks or CR."""
    return _ANSI.sub("", _RANK_PREFIX.sub("", line, count=1)).rstrip()


def _is_indented(text: str) -> bool:
    return text[:1] in (" ", "\t")


def _is_log_record(text: str) -> bool:
    return _LOG_RECORD.match(text) is not None


def _ends_message(text: str) -> bool:
    return not text or _is_log_record(text) or text == TRACEBACK_HEADER or text in CHAIN_HEADERS


def _message_end(texts: Sequence[str], first: int) -> int:
    """One past the last continuation line of the exception message starting at `first`."""
    end = first + 1
    while end < len(texts) and end - first <= MAX_MESSAGE_LINES and not _ends_message(texts[end]):
        end += 1
    return end


def _parse_part(texts: Sequence[str], start: int) -> tuple[_Part | None, int]:
    """The traceback whose header is at `start`, or None and where to resume when cut off.

    Blank lines and log records interleaved with the frames (another thread printing, a
    C++ warning) are skipped, so they neither end the traceback nor appear in it.
    """
    kept = [start]
    i = start + 1
    while i < len(texts):
        text = texts[i]
        if _is_indented(text):
            kept.append(i)
        elif text == TRACEBACK_HEADER:
            return None, i  # cut off: a new traceback starts before an exception line
        elif text and not _is_log_record(text) and _EXCEPTION_LINE.match(text):
            end = _message_end(texts, i)
            return _Part(tuple(kept) + tuple(range(i, end)), i, end), end
        i += 1
    return None, i


def _next_chain_start(texts: Sequence[str], i: int) -> int | None:
    """The header line of the chain's next traceback, if a chain header follows at `i`."""
    i = _skip_blank(texts, i)
    if i >= len(texts) or texts[i] not in CHAIN_HEADERS:
        return None
    i = _skip_blank(texts, i + 1)
    return i if i < len(texts) and texts[i] == TRACEBACK_HEADER else None


def _skip_blank(texts: Sequence[str], i: int) -> int:
    while i < len(texts) and not texts[i]:
        i += 1
    return i


def _parse_chain(texts: Sequence[str], start: int) -> tuple[_Part | None, int]:
    """The chain of tracebacks starting at `start`, up to its last complete exception."""
    part, resume = _parse_part(texts, start)
    if part is None:
        return None, resume
    while (following := _next_chain_start(texts, part.end)) is not None:
        nxt, resume = _parse_part(texts, following)
        if nxt is None:
            return part, resume  # the chain was cut off: keep what arrived complete
        between = tuple(range(part.end, following))  # blank lines and the chain header
        part = _Part(part.kept + between + nxt.kept, nxt.exception, nxt.end)
    return part, part.end


def _capped(block: Sequence[str]) -> tuple[str, ...]:
    if len(block) <= MAX_BLOCK_LINES:
        return tuple(block)
    tail = MAX_BLOCK_LINES - HEAD_LINES - 1
    hidden = len(block) - HEAD_LINES - tail
    return (*block[:HEAD_LINES], f"... {hidden} lines not shown", *block[-tail:])


def last_traceback(lines: Sequence[str]) -> tuple[tuple[str, ...], str] | None:
    """The last complete Python traceback in a rank's output lines, and its exception line.

    Lines may carry PyTorch's `[rankN]:` prefix: it is ignored for analysis and kept in
    the returned block. A chained traceback is returned whole. None when no traceback
    reached its exception line.
    """
    texts = [_text(line) for line in lines]
    found: _Part | None = None
    i = 0
    while i < len(texts):
        if texts[i] != TRACEBACK_HEADER:
            i += 1
            continue
        part, i = _parse_chain(texts, i)
        found = part or found
    if found is None:
        return None
    return _capped([lines[k] for k in found.kept]), texts[found.exception]


def _exception_type(exception: str) -> str:
    """`torch.distributed.DistBackendError: ...` -> `DistBackendError`."""
    return exception.split(":", 1)[0].strip().rsplit(".", 1)[-1]


def _messages(block: Sequence[str]) -> list[str]:
    """The block's exception-message lines: not frames, code, headers or blank lines."""
    texts = (_text(line) for line in block)
    return [t for t in texts if t and not _is_indented(t) and t != TRACEBACK_HEADER]


def is_cascade(exception: str, block: Sequence[str] = ()) -> bool:
    """True when the exception follows another rank's failure: a lost peer (gloo, NCCL,
    the TCPStore), a collective timeout, a teardown signal or torchrun's own report.

    The exception line decides first. NCCL and gloo put the telling part ("ncclRemoteError",
    "Connection reset by peer") on later message lines or in a chained cause, so for those
    the block's message lines are checked too.
    """
    text = _text(exception)
    if _exception_type(text) in CASCADE_TYPES or _CASCADE_MESSAGE.search(text.lower()):
        return True
    messages = [m.lower() for m in (text, *_messages(block))]
    if not any(_BACKEND_MESSAGE.search(m) for m in messages):
        return False
    return any(_CASCADE_MESSAGE.search(m) for m in messages)


def root_cause(tracebacks: Sequence[RankTraceback]) -> RankTraceback | None:
    """The traceback to show first: the earliest that is not a cascade, else the earliest."""
    if not tracebacks:
        return None
    real = [t for t in tracebacks if not t.cascade]
    return min(real or tracebacks, key=lambda t: t.order)


def _orders(ranks: Sequence[int], order: Mapping[int, int]) -> dict[int, int]:
    """Each rank's order; ranks the caller did not time come after all others, by rank."""
    after = max(order.values(), default=-1) + 1
    missing = sorted(r for r in ranks if r not in order)
    return {r: order[r] for r in ranks if r in order} | {
        r: after + n for n, r in enumerate(missing)
    }


def rank_tracebacks(
    lines_by_rank: Mapping[int, Sequence[str]], order: Mapping[int, int]
) -> list[RankTraceback]:
    """A RankTraceback for each rank whose output holds one, root cause first: the real
    failures by order, then the cascades by order. A rank missing from `order` gets an
    order after every timed rank (by rank number), so root_cause agrees with this list."""
    found = {rank: tb for rank, lines in lines_by_rank.items() if (tb := last_traceback(lines))}
    orders = _orders(list(found), order)
    result = [
        RankTraceback(rank, block, exc, is_cascade(exc, block), orders[rank])
        for rank, (block, exc) in found.items()
    ]
    return sorted(result, key=lambda t: (t.cascade, t.order, t.rank))
