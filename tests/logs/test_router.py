"""The head's log router (logs/router.py): pdsh's merged output in, in chunks of any size,
each node's lines in its own log, control records back, lines and frames to the view."""

from __future__ import annotations

import random
from pathlib import Path

from _logmodel import read_log
from _pdsh_output import pdsh_output

from orchestrator.logs.router import VIEW_LINE_MAX, LogRouter
from orchestrator.remote.channel import labelled, line_max
from orchestrator.remote.logwire import WireFramer, encode_control


def feed_in_pieces(router: LogRouter, data: bytes, rng: random.Random) -> list:
    controls = []
    pos = 0
    while pos < len(data):
        step = rng.choice([1, 7, 100, 4096, 70_000])
        controls += router.feed(data[pos : pos + step])
        pos += step
    return controls


def test_numbered_lines_appear_exactly_once_among_tqdm_frames(tmp_path: Path) -> None:
    rng = random.Random(6)
    writes: list[tuple[str, bytes]] = []
    for i in range(5000):
        stream = "out" if i % 2 else "err"
        writes.append((stream, b"line %d of stream\n" % i))
        if i % 100 == 0:
            for pct in range(0, 101, 25):
                writes.append(("err", b"\rbar %d: %3d%%|%s" % (i, pct, b"#" * (pct // 10))))
            writes.append(("err", b"\n"))
    data = pdsh_output("n7", writes)
    router = LogRouter(tmp_path)
    controls = feed_in_pieces(router, data, rng)
    router.close()
    assert [(node, r.text) for node, r in controls] == [("n7", "started"), ("n7", "exit")]
    entries = read_log(tmp_path / "n7.log")
    texts = [text for _, text in entries]
    for i in range(5000):
        assert texts.count(b"line %d of stream" % i) == 1
    for i in range(0, 5000, 100):
        assert (b"err", b"bar %d: 100%%|##########" % i) in entries
        assert not any(t.startswith(b"bar %d:  75%%" % i) for t in texts)
    assert (b"orch", b"exit code=0") in entries


class RecordingView:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []

    def line(self, node: str, stream: str, data: bytes, rank: str = "") -> None:
        self.seen.append((node, stream, data))

    def frame(self, node: str, stream: str, data: bytes, rank: str = "") -> None:
        self.seen.append((node, "frame:" + stream, data))

    def control(self, node: str, kind: str, fields: dict) -> None:
        self.seen.append((node, "control", kind.encode()))


def test_plain_output_and_pdsh_messages(tmp_path: Path) -> None:
    view = RecordingView()
    router = LogRouter(tmp_path, view=view)
    router.feed(b"n2: %o1Lo hello\n")
    router.feed(b"n2: ssh: connect to host n2 port 22: Connection refused\r\n")
    router.feed(b"pdsh@head: n2: ssh exited with exit code 255\n")
    router.feed(b"no prefix at all\n")
    router.close()
    assert read_log(tmp_path / "n2.log") == [
        (b"out", b"hello"),
        (b"sys", b"ssh: connect to host n2 port 22: Connection refused"),
        (b"sys", b"n2: ssh exited with exit code 255"),
    ]
    assert read_log(tmp_path / "_head.log") == [
        (b"sys", b"n2: ssh exited with exit code 255"),
        (b"sys", b"no prefix at all"),
    ]
    assert view.seen == [
        ("n2", "out", b"hello"),
        ("n2", "sys", b"ssh: connect to host n2 port 22: Connection refused\r"),
        ("pdsh@head", "sys", b"n2: ssh exited with exit code 255"),
        ("_head", "sys", b"no prefix at all"),
    ]
    assert router.nodes == ["n2"]


def test_a_quiet_node_s_last_line_reaches_the_file_at_once(tmp_path: Path) -> None:
    router = LogRouter(tmp_path)
    router.feed_lines([b"n1: %%o1Lo step %d" % i for i in range(1000)])  # a burst
    router.feed_lines([b"n1: %o1Lo epoch 1 done, now computing for an hour"])  # then quiet
    entries = read_log(tmp_path / "n1.log")  # read while the router is still open
    assert entries[-1] == (b"out", b"epoch 1 done, now computing for an hour")
    router.close()


def test_router_holds_no_unbounded_partial_line(tmp_path: Path) -> None:
    router = LogRouter(tmp_path)
    for _ in range(40):  # 2.5 MiB of something that is not pdsh output, no newline
        router.feed(b"z" * 65536)
    assert len(router._rest) <= (1 << 20) + 65536
    router.close()
    assert (tmp_path / "_head.log").read_bytes().count(b"z") == 40 * 65536


def test_head_lines_that_look_like_node_prefixes_stay_in_the_head_log(tmp_path: Path) -> None:
    # accelerate prints `WARNING: Skipping ...` on the head, between pdsh's node lines;
    # srun prints its own `srun: error: ...` between its agents' (labelled the same way).
    router = LogRouter(tmp_path, nodes=["n1", "n2"])
    router.feed(b"WARNING: Skipping PDSH_SSH_ARGS_APPEND\nn1: hello\n")
    router.feed(b"srun: error: n2: task 1: Exited with exit code 3\n")
    router.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_head.log", "n1.log"]
    head = (tmp_path / "_head.log").read_bytes()
    assert b"WARNING: Skipping PDSH_SSH_ARGS_APPEND" in head
    assert b"sys srun: error: n2: task 1: Exited with exit code 3" in head
    assert b"hello" in (tmp_path / "n1.log").read_bytes()


# ----- under srun -------------------------------------------------------------------------
SRUN_MESSAGE = 1024  # slurmstepd's MAX_MSG_LEN


def srun_messages(output: bytes) -> list[bytes]:
    """A task's output as slurmstepd hands it to srun (buffered, srun's default): as many
    whole lines as fit in a message of 1024 bytes; a longer line cut every 1024 bytes."""
    messages: list[bytes] = []
    pending = b""
    for line in output.splitlines(keepends=True):
        if len(pending) + len(line) > SRUN_MESSAGE and pending:
            messages.append(pending)
            pending = b""
        while len(line) > SRUN_MESSAGE:
            messages.append(line[:SRUN_MESSAGE])
            line = line[SRUN_MESSAGE:]
        pending += line
    return [*messages, pending] if pending else messages


def srun_task_output(node: str, rank: str, data: bytes) -> bytes:
    """What a node's agent writes under srun: its rank's output framed for the channel its
    node's label leaves, each line labelled (remote/channel.py)."""
    label = node.encode() + b": "
    framer = WireFramer("out", rank, line_max(label))
    wire = [encode_control("started", pid=1), *framer.feed(data), *framer.flush(),
            encode_control("exit", code=0)]  # fmt: skip
    return b"".join(labelled(label, w) for w in wire)


def test_under_srun_a_long_line_of_one_node_swallows_no_line_of_another(tmp_path: Path) -> None:
    """srun writes each message whole, but the nodes' messages in any order: a line longer
    than a message, cut, would take in whatever another node said between its pieces."""
    every_byte = bytes(b for b in range(256) if b not in b"\r\n\x1b")  # ESC: the file drops
    long_line = b"rank 0 config " + every_byte * 40
    first = srun_messages(srun_task_output("n1", "0/0", long_line + b"\nrank 0 step 1\n"))
    second = srun_messages(srun_task_output("n2", "2/0", b"rank 2 step 1 sum 21\n"))
    assert len(first) > 5
    view = RecordingView()
    for at in range(len(first) + 1):
        runs = tmp_path / str(at)
        router = LogRouter(runs, view=view, nodes=["n1", "n2"])
        router.feed(b"".join([*first[:at], *second, *first[at:]]))
        router.close()
        assert [(tag, text) for tag, text in read_log(runs / "n1.log") if tag != b"orch"] == [
            (b"r0/0 out", long_line), (b"r0/0 out", b"rank 0 step 1")
        ]  # fmt: skip
        assert (b"r2/0 out", b"rank 2 step 1 sum 21") in read_log(runs / "n2.log")
        assert not (runs / "_head.log").exists()
    # The live view sees the long line whole too, not its last piece.
    assert ("n1", "out", long_line) in view.seen


def test_the_view_takes_a_huge_line_from_its_start_and_the_file_all_of_it(tmp_path: Path) -> None:
    view = RecordingView()
    router = LogRouter(tmp_path, view=view)
    line = b"ValueError: " + b"v" * (4 * VIEW_LINE_MAX)
    router.feed(pdsh_output("n1", [("out", line + b"\n")]))
    router.close()
    assert [data for node, stream, data in view.seen if stream == "out"] == [line[:VIEW_LINE_MAX]]
    assert (b"out", line) in read_log(tmp_path / "n1.log")


def test_a_bar_ended_by_a_blank_line_reaches_the_view_as_the_line_the_log_has(tmp_path) -> None:
    # `print(bar, end="\\r")` then `print()`: the frame, then an empty line that ends it.
    view = RecordingView()
    router = LogRouter(tmp_path, view=view)
    framer = WireFramer("err", "0/0")
    for data in (b" 90%|######### | 9/10\r", b"100%|##########| 10/10\r", b"\n"):
        router.feed(b"".join(b"n1: " + wire for wire in framer.feed(data)))
    router.close()
    assert read_log(tmp_path / "n1.log") == [(b"r0/0 err", b"100%|##########| 10/10")]
    assert [seen for seen in view.seen if seen[1] == "err"] == [
        ("n1", "err", b"100%|##########| 10/10")
    ]  # fmt: skip
