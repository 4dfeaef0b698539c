"""NCCL's flight recorder for every rank of the job, in the names the node's torch reads.
STANDARD LIBRARY ONLY (shipped inline beside the agent).

torch 2.8 renamed TORCH_NCCL_TRACE_BUFFER_SIZE to TORCH_FR_BUFFER_SIZE and reads the old
name as a fallback that prints `... is deprecated; use TORCH_FR_BUFFER_SIZE instead` on
every rank (the dump file's TORCH_NCCL_DEBUG_INFO_TEMP_FILE likewise became
TORCH_FR_DUMP_TEMP_FILE); older torch reads only the old names. The node's torch version is
read from torch/version.py where the interpreter would import torch from: importing torch
takes seconds, finding it a fraction of a millisecond.
"""

from __future__ import annotations

import importlib.util
import os
import re

RENAMED_IN = (2, 8)
_VERSION = re.compile(r"""^__version__\s*=\s*['"](\d+)\.(\d+)""", re.MULTILINE)


def torch_version() -> tuple[int, int] | None:
    """(major, minor) of the torch this interpreter would import, or None (none, or unread)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    try:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as handle:
            return parse_version(handle.read())
    except OSError:
        return None


def parse_version(source: str) -> tuple[int, int] | None:
    """(major, minor) from torch/version.py's text."""
    match = _VERSION.search(source)
    return (int(match.group(1)), int(match.group(2))) if match else None


def flight_recorder_env(directory: str, version: tuple[int, int] | None) -> dict[str, str]:
    """The last 2000 collectives kept, dumped when a collective times out (GPU jobs with NCCL;
    ignored by gloo), one file per rank in the node's run directory, which comes back to the
    head with the logs. With the torch version unknown, both names of each setting."""
    stem = os.path.join(directory, "nccl_trace_rank_")
    new = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": stem}
    old = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": stem}
    names = {**old, **new} if version is None else new if version >= RENAMED_IN else old
    return {**names, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
