"""NCCL's flight recorder for every rank of the job. STANDARD LIBRARY ONLY (shipped inline
beside the agent)."""

from __future__ import annotations

import os


def flight_recorder_env(directory: str) -> dict[str, str]:
    """NCCL's flight recorder for every rank of the job (GPU jobs with NCCL; ignored by
    gloo): the last 2000 collectives kept, dumped when a collective times out, one file
    per rank in the node's run directory, which comes back to the head with the logs.
    Both names of each setting: older torch reads TORCH_NCCL_*, newer TORCH_FR_*."""
    stem = os.path.join(directory, "nccl_trace_rank_")
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": stem,
        "TORCH_FR_DUMP_TEMP_FILE": stem,
    }
