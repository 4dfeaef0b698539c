"""Run on a sandbox node by the log-path tests: a rank's output, framed as the agent frames it.

argv: <repo root> <raw dir> <node> <lines per stream> [<seconds to pause every 1000 lines>]

Writes `<lines>` numbered lines to each of stdout and stderr (in bursts of random
size, as buffered output arrives), real tqdm bars and hand-made \\r frames on
stderr, a 1 MiB line, invalid UTF-8 and a NUL, and a last line with no newline.
Every byte also goes, raw, to <raw dir>/<node>/{stdout,stderr}.raw. The wire
goes to stdout; at the end an `exit` control message carries each stream's
sha256, so the head can check the raw files it pulls back.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import time

sys.path.insert(0, sys.argv[1])

from tqdm import tqdm

from orchestrator.logwire import WireFramer, encode_control

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


class TqdmFile:
    """What tqdm writes to: the rank's stderr."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        self.stream.write(text.encode())

    def flush(self) -> None:
        WIRE.flush()


def main() -> None:
    raw_dir, node, lines = sys.argv[2], sys.argv[3], int(sys.argv[4])
    pause = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    os.makedirs(f"{raw_dir}/{node}", exist_ok=True)
    rng = random.Random(node)
    streams = {n: Stream(n, f"{raw_dir}/{node}/std{n}.raw") for n in ("out", "err")}
    pending: dict[str, list[bytes]] = {"out": [], "err": []}

    def drain(name: str) -> None:
        if pending[name]:
            streams[name].write(b"".join(pending[name]))
            pending[name] = []

    for i in range(lines):
        for name in ("out", "err"):
            pending[name].append(b"%s %s line %d\n" % (node.encode(), name.encode(), i))
            if len(pending[name]) >= rng.randint(1, 60):
                drain(name)
        if i % 20000 == 5000:
            drain("err")
            for _ in tqdm(range(40), file=TqdmFile(streams["err"]), mininterval=0,
                          ascii=True, desc=f"bar{i}"):  # fmt: skip
                pass
        if i % 7000 == 3000:
            drain("err")
            streams["err"].write(b"".join(b"\rmanual%d %d/10" % (i, k) for k in range(11)) + b"\n")
        if i == lines // 2:
            drain("out")
            drain("err")
            streams["out"].write(b"big:" + b"x" * (1 << 20) + b"\n")
            streams["err"].write(b"bad utf8: \xff\xfe\xc3( \x00nul \\x41 \x1b[31mred\x1b[0m\n")
        if pause and i % 1000 == 999:
            WIRE.flush()
            time.sleep(pause)
    for name in ("out", "err"):
        drain(name)
    streams["out"].write(b"tail without newline")
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
