"""The head's live view: readable on a terminal and in a pipe, and cheap either way."""

from __future__ import annotations

import io

from launch_support import wait_for
from rich.console import Console

from orchestrator.logs.router import LogRouter
from orchestrator.logs.view import LiveView, PlainView, make_view
from orchestrator.remote.logwire import WireFramer


def test_plain_view_prefixes_lines_and_throttles_frames() -> None:
    out = io.BytesIO()
    now = [0.0]
    view = PlainView(out, frame_interval=5.0, clock=lambda: now[0])
    view.control("n1", "started", {"node_rank": 0})
    view.line("n1", "out", b"\x1b[32mready\x1b[0m", rank="0/0")
    for step in range(100):
        now[0] = step * 0.1  # 10 s of frames, 10 per second
        view.frame("n1", "err", b"%d/100" % step, rank="0/0")
        view.frame("n2", "err", b"n2 %d/100" % step, rank="1/0")
    view.line("n2", "err", b"n2 done")  # the node's launcher: no rank
    view.line("n2", "err", b"forged", rank="x/y")  # not a label orch writes: no rank shown
    view.close()
    lines = out.getvalue().decode().splitlines()
    assert lines[0] == "n1 r0: ready"
    assert [x for x in lines if x.startswith("n1")] == ["n1 r0: ready", "n1 r0: 0/100",
                                                        "n1 r0: 50/100"]  # fmt: skip
    # Rank 1's last frame waits for rank 1's own next line (or its hold to pass), not for
    # the launcher's: that may be the bar's close, which would show the same count again.
    assert [x for x in lines if x.startswith("n2")] == [
        "n2 r1: n2 0/100", "n2: n2 done", "n2: forged", "n2 r1: n2 50/100"
    ]  # fmt: skip
    assert "\x1b" not in out.getvalue().decode() and "\r" not in out.getvalue().decode()


class _PipeToHead(io.BytesIO):
    """`orch launch ... | head -1`: the reader takes one line, then is gone."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data) -> int:  # type: ignore[override]
        self.writes += 1
        if self.writes > 1:
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(data)

    def flush(self) -> None:
        if self.writes > 1:
            raise BrokenPipeError(32, "Broken pipe")


def test_plain_view_keeps_the_job_going_once_its_reader_is_gone() -> None:
    out = _PipeToHead()
    view = PlainView(out)
    for step in range(1, 4):
        view.line("n1", "out", b"step %d" % step)  # never raises into the job's watch loop
    view.frame("n1", "err", b"50%")
    view.close()
    assert out.getvalue() == b"n1: step 1\n"  # what the reader took
    assert out.writes == 2  # after the broken pipe the view writes nothing more


def test_live_view_shows_latest_frame_per_node_and_lines_above() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100, color_system=None)
    view = LiveView(["n1", "n2"], console=console, tick=0.05)
    view.line("n1", "out", b"epoch 1 starting")
    view.frame("n1", "err", b" 40%|####      | 4/10")
    view.frame("n2", "err", b" 70%|#######   | 7/10")
    view.control("n2", "exit", {"code": 0})
    view.close()
    text = buffer.getvalue()
    assert "n1: epoch 1 starting" in text
    assert "40%|####      | 4/10" in text
    assert "70%|#######   | 7/10" in text
    assert "done" in text


def test_live_view_does_not_print_every_line_of_a_flood() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100, color_system=None)
    view = LiveView(["n1"], console=console, max_lines_per_second=100, tick=10.0)
    for i in range(5000):
        view.line("n1", "out", b"line %d" % i)
    view.close()
    text = buffer.getvalue()
    assert text.count("n1: line ") == 1000  # 100 lines/s over one 10 s tick
    assert "4000 lines not shown" in text
    assert "line 4999" in text  # the node's row still shows its latest line


def test_make_view_is_plain_without_a_terminal() -> None:
    view = make_view(tty=False)
    assert isinstance(view, PlainView)
    view.close()


def test_plain_view_prints_a_finished_bar_once_and_keeps_frames_in_order() -> None:
    out = io.BytesIO()
    now = [0.0]
    view = PlainView(out, frame_interval=5.0, clock=lambda: now[0])
    view.frame("n1", "err", b"train:  50%|#####     | 20/40 [00:02<00:02, 9.2it/s]", rank="0/0")
    view.line("n1", "out", b"step 20 loss 1.18", rank="0/0")  # the held frame comes first
    view.frame("n1", "err", b"train: 100%|##########| 40/40 [00:04<00:00, 9.18it/s]", rank="0/0")
    view.line("n2", "out", b"step 40 loss 0.04", rank="2/0")  # another node: no effect on n1
    # tqdm's close: the same count again, with the final rate, and a newline.
    view.line("n1", "err", b"train: 100%|##########| 40/40 [00:04<00:00, 9.15it/s]", rank="0/0")
    view.frame("n1", "err", b"eval:   0%|          | 0/8", rank="0/0")
    now[0] = 2.0
    view.close()  # a bar left open still shows its last frame
    assert out.getvalue().decode().splitlines() == [
        "n1 r0: train:  50%|#####     | 20/40 [00:02<00:02, 9.2it/s]",
        "n1 r0: step 20 loss 1.18",
        "n2 r2: step 40 loss 0.04",
        "n1 r0: train: 100%|##########| 40/40 [00:04<00:00, 9.15it/s]",
        "n1 r0: eval:   0%|          | 0/8",
    ]


def test_plain_view_prints_a_held_frame_once_it_has_waited() -> None:
    out = io.BytesIO()
    now = [0.0]
    reads = [0]  # each of the flusher's rounds reads the clock once

    def clock() -> float:
        reads[0] += 1
        return now[0]

    view = PlainView(out, frame_hold=1.0, flush_interval=0.01, clock=clock)
    view.frame("n1", "err", b" 10%|#         | 1/10", rank="0/0")
    held_at = reads[0]
    assert wait_for(lambda: reads[0] >= held_at + 2, 10, 0.005)  # a whole round since
    assert out.getvalue() == b""  # held: tqdm's close may still follow
    now[0] = 1.5
    assert wait_for(lambda: b"1/10" in out.getvalue(), 10, 0.01)
    assert out.getvalue() == b"n1 r0:  10%|#         | 1/10\n"
    view.close()


def test_a_restart_shows_which_attempt_runs_and_drops_the_lost_nodes_row() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, color_system=None)
    view = LiveView(["n1", "n2"], console=console, tick=0.05)
    view.control("n2", "exit", {"code": 1})
    view.new_attempt(["n1", "n3"], "attempt 2 (attempt 1 ended, exit 1: node lost: n2)")
    view.frame("n3", "err", b"restart 1 starts at step 20")
    rendered = Console(file=io.StringIO(), width=120, color_system=None)
    rendered.print(view)
    text = rendered.file.getvalue()
    view.close()
    assert "attempt 2 (attempt 1 ended, exit 1: node lost: n2)" in text
    assert "n3" in text and "restart 1 starts at step 20" in text
    assert "n2" not in text.replace("node lost: n2", "")


# tqdm's last two writes of a bar (its last update, then its close's redraw), then its close's
# newline in a write of its own; `█` as tqdm draws it on a UTF-8 stream.
BAR_10 = "\repoch 1:  91%|█████████ | 10/11 [00:00<00:00, 34.02it/s]".encode()
BAR_END = "epoch 1: 100%|██████████| 11/11 [00:00<00:00, 33.97it/s]".encode()


def test_a_ranks_finished_bar_shows_once_among_its_nodes_other_ranks_output(tmp_path) -> None:
    # Node n2 runs ranks 2 and 3, each framed on its own channel. Rank 2's read ends after
    # the close's redraw, so its agent sends that as a frame; rank 3's output reaches the
    # head before rank 2's newline, which then ends the bar with the same text as a line.
    out = io.BytesIO()
    view = PlainView(out, frame_interval=5.0, clock=lambda: 0.0)
    rank2, rank3 = WireFramer("err", "2/0"), WireFramer("err", "3/1")
    reads = [
        (rank2, BAR_10 + b"\r" + BAR_END),
        (rank3, b"rank 3 waits at the barrier\n"),
        (rank2, b"\n"),
        (rank2, b"rank 2 epoch 1 loss 0.04\n"),
    ]
    with LogRouter(tmp_path, view=view, nodes=["n2"]) as router:
        for framer, data in reads:
            router.feed(b"".join(b"n2: " + wire for wire in framer.feed(data)))
    view.close()
    assert out.getvalue().decode().splitlines() == [
        "n2 r3: rank 3 waits at the barrier",
        "n2 r2: " + BAR_END.decode(),
        "n2 r2: rank 2 epoch 1 loss 0.04",
    ]


def test_a_bars_count_drawn_again_is_printed_once() -> None:
    # tqdm's last update and its close's redraw: the same count at another rate. Another
    # rank's line between them lets the second through the node's frame throttle.
    out = io.BytesIO()
    view = PlainView(out, frame_interval=5.0, clock=lambda: 0.0)
    view.frame("n2", "err", b"epoch 1: 100%|##########| 11/11 [00:00<00:00, 34.50it/s]", "2/0")
    view.line("n2", "out", b"rank 3 done", rank="3/1")
    view.frame("n2", "err", b"epoch 1: 100%|##########| 11/11 [00:00<00:00, 33.97it/s]", "2/0")
    view.close()
    assert out.getvalue().decode().splitlines() == [
        "n2 r3: rank 3 done", "n2 r2: epoch 1: 100%|##########| 11/11 [00:00<00:00, 33.97it/s]"
    ]  # fmt: skip


def test_a_stop_under_way_is_said_above_the_nodes_and_once_per_change_in_a_pipe() -> None:
    from orchestrator.outcome.states import StopCause
    from orchestrator.run.stop import Stop
    from orchestrator.specs.stop import StopSettings

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=160, color_system=None)
    live = LiveView(["n1", "n2"], console=console, tick=0.05)
    stop = Stop(StopCause.CTRL_C, StopSettings(), world_size=4)
    stop.show(live, 1, 120.0)
    rendered = Console(file=io.StringIO(), width=160, color_system=None)
    rendered.print(live)
    live.close()
    assert ("stopping (Ctrl-C): 1 of 4 ranks exited, 0 s of the 120 s grace; Ctrl-C again "
            "stops at once") in rendered.file.getvalue()  # fmt: skip
    out = io.BytesIO()
    plain = PlainView(out)
    for exited in (0, 0, 0, 2, 2, 4):
        stop.show(plain, exited, 120.0)
    plain.close()
    lines = out.getvalue().decode().splitlines()
    assert [line.split(" exited,")[0] for line in lines] == [
        f"head: stopping (Ctrl-C): {n} of 4 ranks" for n in (0, 2, 4)]
