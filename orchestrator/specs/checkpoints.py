"""Where a job writes its checkpoints (`--checkpoint-dir`, a recipe's `checkpoint_dir`) and how
orch keeps them when the nodes share no filesystem: on how many other nodes each complete
checkpoint is copied (`--checkpoint-copies`, `checkpoint_copies`) and how fast at most
(`--checkpoint-bandwidth`, `checkpoint_bandwidth`). Each read from what the user typed, with
one wording for what is wrong, before anything runs; the ranks see the directory as
ORCH_CHECKPOINT_DIR. Pure.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.errors import UsageError

DEFAULT_COPIES = 1
DEFAULT_BANDWIDTH_TEXT = "200M"
DEFAULT_BANDWIDTH = 200_000_000  # bytes per second: DEFAULT_BANDWIDTH_TEXT
NO_CAP = 0
_NO_CAP_WORDS = ("0", "off", "none")
# Decimal units as a rate is written (200M: 200 MB/s); the binary ones where asked (Mi).
_MULTIPLIERS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
                "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}  # fmt: skip
_RATE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*([kmgt]i?)?b?(?:/s)?", re.IGNORECASE)
_RATE_UNITS = (("TB/s", 10**12), ("GB/s", 10**9), ("MB/s", 10**6), ("kB/s", 10**3))


@dataclass(frozen=True)
class CheckpointSettings:
    """The job's checkpoints: `dir` the directory, the same absolute path on every node
    (as the plan holds it; a request's may still be relative to the workdir), `copies` how
    many other nodes hold each complete checkpoint, `bandwidth` their copying's cap in bytes
    per second (0: none)."""

    dir: str
    copies: int = DEFAULT_COPIES
    bandwidth: int = DEFAULT_BANDWIDTH

    def to_dict(self) -> dict[str, object]:
        return {"dir": self.dir, "copies": self.copies, "bandwidth": self.bandwidth}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CheckpointSettings:
        """As to_dict wrote it; a ValueError for anything else."""
        directory, copies, bandwidth = data.get("dir"), data.get("copies"), data.get("bandwidth")
        if not isinstance(directory, str) or not _is_count(copies) or not _is_count(bandwidth):
            raise ValueError(f"checkpoint settings {dict(data)!r}: want dir, copies, bandwidth")
        return cls(directory, int(copies), int(bandwidth))  # type: ignore[arg-type]

    @property
    def words(self) -> str:
        """`/data/ckpt, 1 copy on another node, at most 200 MB/s`."""
        return f"{self.dir}, {copies_words(self.copies)}, {bandwidth_words(self.bandwidth)}"


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def copies_words(copies: int) -> str:
    """`1 copy on another node`, `2 copies on other nodes`."""
    return "1 copy on another node" if copies == 1 else f"{copies} copies on other nodes"


def bandwidth_words(bandwidth: int) -> str:
    """`at most 200 MB/s`, `at most 1.5 GB/s`; `no bandwidth cap` for 0."""
    return "no bandwidth cap" if bandwidth == NO_CAP else f"at most {rate_text(bandwidth)}"


def rate_text(bytes_per_second: int) -> str:
    """`200 MB/s`, `1.5 GB/s`, `500 kB/s`, `800 B/s`: decimal units, as the rate is typed."""
    for unit, size in _RATE_UNITS:
        if bytes_per_second >= size:
            return f"{bytes_per_second / size:.4g} {unit}"
    return f"{bytes_per_second} B/s"


def check_dir(path: str, what: str = "--checkpoint-dir") -> str:
    """The checkpoint directory as given, normalised: absolute, or relative to the job's
    workdir (resolved with `resolved_dir`). `~` is refused: a node's home may not be the
    head's, and every node needs the same path."""
    text = path.strip()
    if not text:
        raise UsageError(f"{what} is empty: it names the directory the job writes its "
                         "checkpoints in", f"e.g. {what} /data/ckpt")  # fmt: skip
    if text.startswith("~"):
        raise UsageError(
            f"{what} {path!r}: ~ is each node's own home, which may differ between nodes: "
            "give an absolute path, the same on every node",
            f"e.g. {what} /data/ckpt",
        )
    if "\0" in text:
        raise UsageError(f"{what} {path!r} holds a NUL byte", "give a plain path")
    normal = posixpath.normpath(text)
    if not normal.strip("/"):  # normpath keeps `//` as it is
        raise UsageError(f"{what} /: the checkpoints need a directory of their own",
                         f"e.g. {what} /data/ckpt")  # fmt: skip
    return normal


def resolved_dir(path: str, workdir: str, what: str = "--checkpoint-dir") -> str:
    """`path` as every node sees it: a relative one is taken in the job's workdir, the same
    on every node."""
    absolute = posixpath.normpath(posixpath.join(workdir, check_dir(path, what)))
    if not posixpath.isabs(absolute):
        raise UsageError(
            f"{what} {path!r} is relative, and so is the job's workdir {workdir!r}: the nodes "
            "need one absolute path",
            f"give an absolute path, e.g. {what} /data/ckpt, or an absolute --workdir",
        )
    if not absolute.strip("/"):
        raise UsageError(f"{what} {path!r} in {workdir} is /: the checkpoints need a "
                         "directory of their own", f"e.g. {what} /data/ckpt")  # fmt: skip
    return absolute


def check_copies(copies: int, what: str = "--checkpoint-copies") -> int:
    """How many other nodes hold each checkpoint: at least 1."""
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise UsageError(
            f"{what} {copies}: each checkpoint is copied to at least 1 other node",
            f"e.g. {what} 1 (the default); where every node sees the directory (a shared "
            "filesystem) orch copies nothing anyway",
        )
    return copies


def bandwidth_bytes(text: str | float, what: str = "--checkpoint-bandwidth") -> int:
    """Bytes per second from `200M`, `1G`, `500k`, `1.5G`, `64Mi`, `100MB/s` or a number of
    bytes (k, M, G, T: powers of 1000; Ki, Mi, Gi, Ti: of 1024); 0, `off` or `none`: no cap."""
    word = str(text).strip()
    if word.lower() in _NO_CAP_WORDS:
        return NO_CAP
    found = _RATE.fullmatch(word)
    if found is None or (isinstance(text, float) and not math.isfinite(text)):
        raise UsageError(f"{what} {text!r} is not a rate in bytes per second "
                         f"({DEFAULT_BANDWIDTH_TEXT}, 1G, 500k; off: no cap)",
                         f"e.g. {what} {DEFAULT_BANDWIDTH_TEXT} (the default)")  # fmt: skip
    number, unit = found.groups()
    rate = round(float(number) * _MULTIPLIERS[(unit or "").lower()])
    if rate < 1:
        raise UsageError(f"{what} {text!r} is under 1 byte per second",
                         f"e.g. {what} {DEFAULT_BANDWIDTH_TEXT} (the default)")  # fmt: skip
    return rate

