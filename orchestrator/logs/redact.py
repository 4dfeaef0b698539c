"""Secret values masked out of what orch keeps and shows: the fan-out's output as the head
reads it (`Redactor`, line by line), and the raw node logs pulled back into the record
(`redact_file`), with the same values (`secret_values`): a rank that prints its token, or a
launcher that logs its environment, leaves `***` in both.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.specs.jobenv import REDACTED, is_secret

MIN_SECRET = 4  # shorter values (a 1, a yes) would mask ordinary text everywhere
_MASK = REDACTED.encode()
_BLOCK = 1 << 20


def secret_values(plan: LaunchPlan, environ: Mapping[str, str]) -> tuple[str, ...]:
    """What is masked in a job's logs: the head's secrets by name (the head launcher hands
    its whole environment to DeepSpeed, which logs it), and the job's secret variables."""
    head = [value for name, value in environ.items() if is_secret(name)]
    job = [value for name, value in plan.job.env.items() if name in plan.secret_names]
    return tuple(dict.fromkeys(head + job))


def _as_patterns(secrets: Iterable[str]) -> list[bytes]:
    # Longest first: a secret that contains another is masked whole.
    values = {v.encode() for v in secrets if len(v) >= MIN_SECRET}
    return sorted(values, key=len, reverse=True)


def mask(data: bytes, patterns: list[bytes]) -> bytes:
    for secret in patterns:
        if secret in data:
            data = data.replace(secret, _MASK)
    return data


class Redactor:
    """Splits output into lines and masks secret values (DeepSpeed logs its export line)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = _as_patterns(secrets)
        self._rest = b""

    def lines(self, chunk: bytes) -> list[bytes]:
        data = self._rest + chunk
        lines = data.split(b"\n")
        self._rest = lines.pop()
        return [mask(line, self.secrets) for line in lines] if self.secrets else lines

    def rest(self) -> list[bytes]:
        rest, self._rest = self._rest, b""
        return [mask(rest, self.secrets)] if rest else []


def redact_stream(source: BinaryIO, target: BinaryIO, secrets: Iterable[str], *,
                  block: int = _BLOCK) -> None:  # fmt: skip
    """Copy `source` to `target` with every secret masked, in blocks whatever its lines
    (a raw log may be one line of carriage returns)."""
    _copy_masked(source, target, _as_patterns(secrets), block)


def _copy_masked(source: BinaryIO, target: BinaryIO, patterns: list[bytes], block: int) -> None:
    # The last bytes of each block wait for the next: a secret cut by a block's end is
    # masked all the same.
    hold = max((len(p) for p in patterns), default=1) - 1
    pending = b""
    while chunk := source.read(block):
        data = mask(pending + chunk, patterns)
        cut = max(0, len(data) - hold)  # a secret starting before `cut` ended inside `data`
        target.write(data[:cut])
        pending = data[cut:]
    target.write(mask(pending, patterns))


def redact_file(path: Path, secrets: Iterable[str]) -> None:
    """Mask the secrets in `path`, replaced whole (a reader never sees it half done); left as
    it is when there is nothing to mask."""
    patterns = _as_patterns(secrets)
    if not patterns:
        return
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as target, path.open("rb") as source:
            _copy_masked(source, target, patterns, _BLOCK)
        os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
