"""Run on a sandbox node by the log-path tests: a rank's output, framed as the agent frames it.

argv: <repo root> <raw dir> <node> <lines per stream> [<seconds to pause every 1000 lines>]

Writes what _logoutput.write_rank_output writes, on two streams. Every byte also
goes, raw, to <raw dir>/<node>/{stdout,stderr}.raw. The wire goes to stdout; at
the end an `exit` control message carries each stream's sha256, so the head can
check the raw files it pulls back.
"""

from __future__ import annotations

import hashlib
import os
import sys

sys.path.insert(0, sys.argv[1])

from _logoutput import write_rank_output  # beside this file

from orchestrator.remote.logwire import WireFramer, encode_control

WIRE = sys.stdout.buffer


class Stream:
    def __init__(self, name: str, raw_path: str) -> None:
        self.framer = WireFramer(name)
        self.raw = open(raw_path, "wb")  # noqa: SIM115
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.raw.write(data)
        self.raw.flush()
        self.sha.update(data)
        wire = self.framer.feed(data)
        if wire:
            WIRE.write(b"".join(wire))

    def close(self) -> None:
        wire = self.framer.flush()
        if wire:
            WIRE.write(b"".join(wire))
        self.raw.close()


def main() -> None:
    raw_dir, node, lines = sys.argv[2], sys.argv[3], int(sys.argv[4])
    pause = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    os.makedirs(f"{raw_dir}/{node}", exist_ok=True)
    streams = {n: Stream(n, f"{raw_dir}/{node}/std{n}.raw") for n in ("out", "err")}
    write_rank_output(streams, node.encode(), lines, seed=node, pause=pause, flush=WIRE.flush)
    for stream in streams.values():
        stream.close()
    WIRE.write(
        encode_control(
            "exit",
            code=0,
            sha_out=streams["out"].sha.hexdigest(),
            sha_err=streams["err"].sha.hexdigest(),
        )
    )
    WIRE.flush()


if __name__ == "__main__":
    main()
