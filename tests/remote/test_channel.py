"""The agent's channel to the head: under srun, what it writes fits srun's messages."""

from __future__ import annotations

import os

from orchestrator.remote.channel import SRUN_LINE_MAX, Channel, labelled, line_max
from orchestrator.remote.logwire import decode_wire, encode_control


def sent_by(channel: Channel) -> list[bytes]:
    sent: list[bytes] = []
    channel.send = sent.append  # type: ignore[method-assign]  # what would go to fd 1
    return sent


def test_under_srun_a_long_control_message_fits_one_message_with_its_label() -> None:
    label = b"gpu-node-017: "
    channel = Channel(label)
    sent = sent_by(channel)
    channel.control("exit", code=127, node="gpu-node-017", error="no dir /" + "d" * 3000)
    channel.close()
    [line] = sent
    assert len(labelled(label, line)) <= SRUN_LINE_MAX
    record = decode_wire(line)
    assert record is not None and record.fields["code"] == 127
    assert record.fields["error"].startswith("no dir /ddd")


def test_under_pdsh_a_control_message_goes_as_it_is() -> None:
    channel = Channel()
    sent = sent_by(channel)
    channel.control("exit", code=1, error="e" * 3000)
    channel.close()
    assert sent == [encode_control("exit", code=1, error="e" * 3000)]
    assert line_max(b"") is None


def test_labelled_puts_the_label_before_every_line() -> None:
    assert labelled(b"n2: ", b"one\ntwo\n") == b"n2: one\nn2: two\n"


def test_a_heartbeat_goes_before_the_output_waiting_behind_a_full_pipe() -> None:
    # The head reads slowly: the pipe is full, the pump is stuck writing, output queues up.
    read_end, write_end = os.pipe()
    channel = Channel(fd=write_end)
    item = b"%o1L1 " + b"x" * 65000 + b"\n"
    for _ in range(8):
        channel.send(item)
    channel.heartbeat(ranks=1)
    channel.close(timeout=0.2)  # the end, behind everything else
    received = b""
    with os.fdopen(read_end, "rb") as pipe:
        while b"heartbeat" not in received:
            received += pipe.read1(65536)
        before_it = received.count(b"%o1L1 ")
        while received.count(b"\n") < 9:
            received += pipe.read1(65536)
    channel.thread.join(5.0)
    os.close(write_end)
    assert not channel.thread.is_alive()
    # At most the item being written and what the pipe already held went first.
    assert before_it <= 3, before_it
    assert received.count(b"%o1L1 ") == 8
    records = [decode_wire(line) for line in received.splitlines(keepends=True)]
    controls = [r for r in records if r is not None and r.kind == "control"]
    assert [r.text for r in controls] == ["heartbeat"] and controls[0].fields["ranks"] == 1
