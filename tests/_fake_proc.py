"""A fabricated /proc entry for the rules of remote/procs.py and remote/rank_watch.py, which
take the /proc directory to read."""

from __future__ import annotations

from pathlib import Path


def fake_process(proc: Path, pid: int, parent: int, env: dict[str, str],
                 state: str = "S") -> None:  # fmt: skip
    """/proc/<pid>'s environ and stat, written again when the pid is there already (as at
    an exec)."""
    where = proc / str(pid)
    where.mkdir(exist_ok=True)
    where.joinpath("environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))
    rest = " ".join(["0"] * 48)  # 52 fields in all, as Linux writes them
    where.joinpath("stat").write_text(f"{pid} (python3 x) {state} {parent} {rest}\n")
