"""What pdsh prints for one node whose job made some writes: the log router's input in the
log-path tests."""

from __future__ import annotations

from orchestrator.remote.logwire import WireFramer, encode_control


def pdsh_output(node: str, writes: list[tuple[str, bytes]]) -> bytes:
    framers = {"out": WireFramer("out"), "err": WireFramer("err")}
    wire = [encode_control("started", pid=1)]
    for stream, data in writes:
        wire += framers[stream].feed(data)
    for framer in framers.values():
        wire += framer.flush()
    wire.append(encode_control("exit", code=0))
    prefix = node.encode() + b": "
    return b"".join(prefix + w for w in wire)
