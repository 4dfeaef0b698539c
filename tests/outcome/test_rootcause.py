"""Root cause of a failed distributed job: the real exception first, the cascades after.

The outputs below are shaped like what PyTorch 2.x, gloo, NCCL and torchrun print.
"""

from __future__ import annotations

import pytest

from orchestrator.outcome.rootcause import (
    RankTraceback,
    is_cascade,
    last_traceback,
    rank_tracebacks,
    root_cause,
)

SITE = "/home/ml/.venv/lib/python3.11/site-packages/torch"
GLOO_CLOSED = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Connection closed by peer [127.0.0.1]:12345"
)
GLOO_RESET = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] "
    "Read error [127.0.0.1]:50376: Connection reset by peer"
)
PG_WARNING = (
    "[rank0]:[W509 12:00:03.123456789 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process "
    "group has NOT been destroyed before we destruct ProcessGroupNCCL. On normal program "
    "exit, the application should call destroy_process_group to ensure that any pending "
    "NCCL operations have finished in this process. (function operator())"
)

# Every rank's traceback starts the same way: the training loop calling its step.
INTO_TRAIN_STEP = [
    "Traceback (most recent call last):",
    '  File "/home/ml/train.py", line 88, in <module>',
    "    main()",
    '  File "/home/ml/train.py", line 81, in main',
    "    loss = train_step(model, batch)",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^",
]
RANK0_BLOCK = [
    *INTO_TRAIN_STEP,
    '  File "/home/ml/train.py", line 52, in train_step',
    '    raise ValueError("bad batch")',
    "ValueError: bad batch",
]
RANK0 = ["step 9 loss 2.3012", "step 10 loss 2.2871", *RANK0_BLOCK]


def _gloo_block(exception: str) -> list[str]:
    return [
        *INTO_TRAIN_STEP,
        '  File "/home/ml/train.py", line 55, in train_step',
        "    dist.all_reduce(loss)",
        f'  File "{SITE}/distributed/c10d_logger.py", line 79, in wrapper',
        "    return func(*args, **kwargs)",
        "           ^^^^^^^^^^^^^^^^^^^^^",
        f'  File "{SITE}/distributed/distributed_c10d.py", line 2288, in all_reduce',
        "    work.wait()",
        exception,
    ]


def _gloo_rank(exception: str) -> list[str]:
    return ["step 9 loss 2.2990", "step 10 loss 2.2865", *_gloo_block(exception)]


# --- last_traceback -------------------------------------------------------------------


def test_the_traceback_and_its_exception_line():
    assert last_traceback(RANK0) == (tuple(RANK0_BLOCK), "ValueError: bad batch")


def test_no_traceback_is_none():
    assert last_traceback([]) is None
    assert last_traceback(["", "step 1 loss 2.30", "   ", "done"]) is None


def test_a_traceback_cut_off_before_its_exception_is_none():
    cut = RANK0_BLOCK[:5]  # the rank was SIGKILLed while printing
    assert last_traceback(["step 10 loss 2.2871", *cut]) is None
    assert last_traceback([*cut, "", "W0509 12:00:04.000000 139 api.py:897] Sending ..."]) is None


def test_a_cut_off_traceback_leaves_the_last_complete_one():
    earlier = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "OSError: [Errno 28] No space left on device",
    ]
    resumed = "2024-05-09 12:00:01,000 - WARNING - checkpoint save failed, continuing"
    result = last_traceback([*earlier, resumed, "step 11 loss 2.2801", *RANK0_BLOCK[:5]])
    assert result == (tuple(earlier), "OSError: [Errno 28] No space left on device")


def test_a_new_traceback_after_a_cut_off_one_is_found():
    lines = [*RANK0_BLOCK[:5], *_gloo_block(GLOO_CLOSED)]
    assert last_traceback(lines) == (tuple(_gloo_block(GLOO_CLOSED)), GLOO_CLOSED)


def test_the_last_of_several_tracebacks_only():
    lines = [*_gloo_block(GLOO_RESET), "", "retrying step 10", *RANK0_BLOCK]
    assert last_traceback(lines) == (tuple(RANK0_BLOCK), "ValueError: bad batch")


def test_warnings_after_the_traceback_are_not_part_of_it():
    prefixed = [f"[rank0]: {line}" for line in RANK0_BLOCK]
    lines = [
        *prefixed,
        PG_WARNING,
        "[rank0]:[W509 12:00:03.2 socket.cpp:464] [c10d] The server socket has failed to bind.",
        "E0509 12:00:04.551000 139 torch/distributed/elastic/multiprocessing/api.py:833] "
        "failed (exitcode: 1) local_rank: 0 (pid: 4011) of binary: /home/ml/.venv/bin/python",
    ]
    assert last_traceback(lines) == (tuple(prefixed), "ValueError: bad batch")


def test_a_warning_printed_among_the_frames_is_left_out():
    # The NCCL watchdog thread writes while the main thread prints its traceback.
    lines = [*RANK0_BLOCK[:3], PG_WARNING, *RANK0_BLOCK[3:]]
    assert last_traceback(lines) == (tuple(RANK0_BLOCK), "ValueError: bad batch")


def test_rank_prefixed_lines_are_kept_as_printed():
    exception = (
        "torch.distributed.DistBackendError: [3] is setting up NCCL communicator and "
        "retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but "
        "store->get('0') got error: Connection reset by peer"
    )
    printed = [
        "[rank3]: Traceback (most recent call last):",
        '[rank3]:   File "/home/ml/train.py", line 30, in <module>',
        "[rank3]:     dist.barrier()",
        f'[rank3]:   File "{SITE}/distributed/distributed_c10d.py", line 3936, in barrier',
        "[rank3]:     work = default_pg.barrier(opts=opts)",
        "[rank3]:            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        f"[rank3]: {exception}",
        "[rank3]: Exception raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:672 "
        "(most recent call first):",
        "[rank3]: frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 "
        f"(0x7f12a509af86 in {SITE}/lib/libc10.so)",
        "[rank3]: frame #1: <unknown function> + 0x5d0ffbe "
        f"(0x7f1290ebefbe in {SITE}/lib/libtorch_cpu.so)",
        "[rank3]:",
        "[rank3]:[W509 12:00:05.1 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group ...",
    ]
    assert last_traceback(printed) == (tuple(printed[:10]), exception)


def test_a_prefix_without_its_space_is_stripped_too():
    printed = [f"[rank12]:{line}" for line in RANK0_BLOCK]
    assert last_traceback(printed) == (tuple(printed), "ValueError: bad batch")


CHAINED = [
    "Traceback (most recent call last):",
    '  File "/home/ml/data.py", line 30, in __getitem__',
    "    return self.samples[index]",
    "           ~~~~~~~~~~~~^^^^^^^",
    "IndexError: list index out of range",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    '  File "/home/ml/train.py", line 88, in <module>',
    "    main()",
    '  File "/home/ml/data.py", line 33, in __getitem__',
    '    raise ValueError(f"bad batch at index {index}") from None',
    "ValueError: bad batch at index 4096",
]


def test_a_chained_traceback_is_returned_whole():
    lines = ["step 10 loss 2.2871", *CHAINED, "", PG_WARNING]
    assert last_traceback(lines) == (tuple(CHAINED), "ValueError: bad batch at index 4096")


def _training_error_from_gloo() -> list[str]:
    return [
        *_gloo_block(GLOO_CLOSED),
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "/home/ml/train.py", line 57, in train_step',
        '    raise TrainingError(f"all_reduce failed at step {step}") from err',
        "TrainingError: all_reduce failed at step 10",
    ]


def test_a_direct_cause_chain_is_returned_whole():
    chain = _training_error_from_gloo()
    result = last_traceback(chain)
    assert result == (tuple(chain), "TrainingError: all_reduce failed at step 10")


def test_a_chain_cut_off_in_its_second_traceback_keeps_the_first():
    assert last_traceback(CHAINED[:11]) == (
        tuple(CHAINED[:5]),
        "IndexError: list index out of range",
    )


CHILD_FAILED_REPORT = [
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "train.py FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2024-05-09_12:00:04",
    "  host      : node0",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : 1 (pid: 4011)",
    "  error_file: <N/A>",
    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    "============================================================",
]
TORCHRUN_BLOCK = [
    "Traceback (most recent call last):",
    '  File "/home/ml/.venv/bin/torchrun", line 8, in <module>',
    "    sys.exit(main())",
    "             ^^^^^^",
    f'  File "{SITE}/distributed/launcher/api.py", line 263, in launch_agent',
    "    raise ChildFailedError(",
    *CHILD_FAILED_REPORT,
]


def test_a_multi_line_message_is_kept_in_the_block_and_first_line_is_the_exception():
    block, exception = last_traceback([*TORCHRUN_BLOCK, "", "$ "]) or ((), "")
    assert block == tuple(TORCHRUN_BLOCK)
    assert exception == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"


def test_a_long_message_keeps_twenty_continuation_lines():
    frames = [
        f"frame #{n}: <unknown function> + 0x{n:x} (0x7f00 in libtorch_cpu.so)" for n in range(40)
    ]
    lines = [*RANK0_BLOCK[:-1], "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970", *frames]
    block, _ = last_traceback(lines) or ((), "")
    assert block == tuple(lines[: len(RANK0_BLOCK) + 20])
    assert block[-1] == "frame #19: <unknown function> + 0x13 (0x7f00 in libtorch_cpu.so)"


def test_a_long_traceback_is_capped_to_its_head_and_tail():
    frames = [
        line
        for depth in range(150)
        for line in (f'  File "/home/ml/model.py", line 40, in forward_{depth}', "    return f(x)")
    ]
    block = ["Traceback (most recent call last):", *frames, "RuntimeError: stack too deep"]
    lines, exception = last_traceback(block) or ((), "")
    assert exception == "RuntimeError: stack too deep"
    assert len(block) == 302 and len(lines) == 200
    assert lines[:20] == tuple(block[:20])
    assert lines[20] == "... 103 lines not shown"
    assert lines[21:] == tuple(block[-179:])
    assert lines[-1] == "RuntimeError: stack too deep"


def test_odd_input_never_raises():
    odd = [
        "Traceback (most recent call last):",
        "",
        "\t",
        "[rank1]:",
        "[rank",
        "\x1b[0m",
        "During handling of the above exception, another exception occurred:",
        "Traceback (most recent call last):",
        "Traceback (most recent call last):",
    ]
    assert last_traceback(odd) is None
    assert last_traceback(["Traceback (most recent call last):"]) is None


def test_colour_codes_do_not_hide_the_exception():
    coloured = [
        "Traceback (most recent call last):",
        '  File \x1b[35m"/home/ml/train.py"\x1b[0m, line \x1b[35m52\x1b[0m, in \x1b[35mmain\x1b[0m',
        "\x1b[1;35mValueError\x1b[0m: \x1b[35mbad batch\x1b[0m",
    ]
    assert last_traceback(coloured) == (tuple(coloured), "ValueError: bad batch")


# --- is_cascade -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exception",
    [
        GLOO_CLOSED,
        GLOO_RESET,
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
        "Timed out waiting 1800000ms for recv operation to complete",
        "BrokenPipeError: [Errno 32] Broken pipe",
        "ConnectionResetError: [Errno 104] Connection reset by peer",
        "torch.distributed.DistBackendError: [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=52, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600047 milliseconds before timing out.",
        "RuntimeError: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL("
        "SeqNum=52, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600047 milliseconds",
        "RuntimeError: NCCL communicator was aborted on rank 2.",
        "torch.distributed.DistNetworkError: failed to recv, got 0 bytes",
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients.",
        "KeyboardInterrupt",
        "torch.distributed.elastic.multiprocessing.api.SignalException: "
        "Process 4012 got signal: 15",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "RuntimeError: DataLoader worker (pid 4120) is killed by signal: Terminated. ",
        "[rank2]: RuntimeError: [Rank 2] ProcessGroupNCCL aborting communicators",
    ],
)
def test_cascades(exception: str):
    assert is_cascade(exception)


@pytest.mark.parametrize(
    "exception",
    [
        "ValueError: bad batch",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
        "op.preamble.length <= op.nbytes. 8 vs 4",
        "RuntimeError: DataLoader worker (pid 4120) is killed by signal: Killed. ",
        "AssertionError",
        "",
    ],
)
def test_real_failures(exception: str):
    assert not is_cascade(exception)


NCCL_SYSTEM_ERROR = [
    "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
    "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
    "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
    "device error. ",
    "Last error:",
    "socketProgressOpt: Call to recv from 10.0.0.2<41326> failed : Connection reset by peer",
]


def test_an_nccl_message_is_a_cascade_by_its_later_lines():
    block = [*_gloo_block(NCCL_SYSTEM_ERROR[0]), *NCCL_SYSTEM_ERROR[1:]]
    assert not is_cascade(NCCL_SYSTEM_ERROR[0])
    assert is_cascade(NCCL_SYSTEM_ERROR[0], block)


def test_a_real_error_raised_from_a_gloo_failure_is_a_cascade():
    chain = _training_error_from_gloo()
    assert is_cascade("TrainingError: all_reduce failed at step 10", chain)


def test_a_reset_in_an_unrelated_chained_error_is_not_a_cascade():
    chain = [
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.11/http/client.py", line 286, in _read_status',
        "ConnectionResetError: [Errno 104] Connection reset by peer",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/home/ml/data.py", line 12, in download',
        "OSError: could not download shard 7 of the training set",
    ]
    assert not is_cascade("OSError: could not download shard 7 of the training set", chain)


# --- root_cause and rank_tracebacks -----------------------------------------------------


def _rt(rank: int, exception: str, cascade: bool, order: int) -> RankTraceback:
    return RankTraceback(rank, (exception,), exception, cascade, order)


def test_root_cause_prefers_a_real_failure_over_an_earlier_cascade():
    real = _rt(0, "ValueError: bad batch", False, 3)
    cascades = [_rt(r, GLOO_CLOSED, True, r - 1) for r in (1, 2, 3)]
    assert root_cause([*cascades, real]) == real


def test_root_cause_of_only_cascades_is_the_earliest():
    first = _rt(2, GLOO_RESET, True, 0)
    later = [_rt(1, GLOO_CLOSED, True, 1), _rt(3, "KeyboardInterrupt", True, 2)]
    assert root_cause([later[0], first, later[1]]) == first


def test_root_cause_of_nothing_is_none():
    assert root_cause([]) is None


def test_a_gloo_cascade_that_failed_first_does_not_hide_the_value_error():
    lines_by_rank = {
        0: RANK0,
        1: _gloo_rank(GLOO_CLOSED),
        2: _gloo_rank(GLOO_CLOSED),
        3: _gloo_rank(GLOO_RESET),
        4: _gloo_rank(GLOO_CLOSED),
        5: [*_gloo_rank(GLOO_CLOSED), "", PG_WARNING.replace("[rank0]", "[rank5]")],
        6: ["step 9 loss 2.2994", "step 10 loss 2.2861"],  # exited without a traceback
    }
    order = {3: 0, 1: 1, 0: 2, 2: 3, 4: 4, 5: 5, 6: 6}  # rank 3 noticed the dead peer first

    result = rank_tracebacks(lines_by_rank, order)

    assert [(t.rank, t.cascade, t.order) for t in result] == [
        (0, False, 2),
        (3, True, 0),
        (1, True, 1),
        (2, True, 3),
        (4, True, 4),
        (5, True, 5),
    ]
    assert result[0] == RankTraceback(0, tuple(RANK0_BLOCK), "ValueError: bad batch", False, 2)
    assert result[1].exception == GLOO_RESET
    assert result[1].lines == tuple(_gloo_block(GLOO_RESET))
    assert result[5].exception == GLOO_CLOSED
    assert root_cause(result) == result[0]


def test_all_cascades_put_the_earliest_first():
    lines_by_rank = {
        0: [*_gloo_block(GLOO_CLOSED)],
        1: [f"[rank1]: {line}" for line in _gloo_block(GLOO_RESET)],
        2: [
            "Traceback (most recent call last):",
            f'  File "{SITE}/distributed/elastic/multiprocessing/api.py", line 79, in handler',
            '    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval)',
            "torch.distributed.elastic.multiprocessing.api.SignalException: "
            "Process 4012 got signal: 15",
        ],
    }
    result = rank_tracebacks(lines_by_rank, {0: 2, 1: 0, 2: 1})
    assert [(t.rank, t.cascade) for t in result] == [(1, True), (2, True), (0, True)]
    assert result[0].exception == GLOO_RESET
    assert root_cause(result) == result[0]


def test_ranks_without_an_order_come_last_by_rank_number():
    lines_by_rank = {
        7: _gloo_rank(GLOO_CLOSED),
        5: _gloo_rank(GLOO_CLOSED),
        2: _gloo_rank(GLOO_CLOSED),
        0: RANK0,
        4: ["KeyboardInterrupt"],  # no traceback: no entry
    }
    result = rank_tracebacks(lines_by_rank, {2: 4, 0: 9})
    assert [(t.rank, t.order) for t in result] == [(0, 9), (2, 4), (5, 10), (7, 11)]


def test_keyboard_interrupt_on_a_rank_is_a_cascade():
    interrupted = [
        "Traceback (most recent call last):",
        '  File "/home/ml/train.py", line 88, in <module>',
        "    main()",
        '  File "/home/ml/train.py", line 60, in main',
        "    for batch in loader:",
        f'  File "{SITE}/utils/data/dataloader.py", line 630, in __next__',
        "    data = self._next_data()",
        "           ^^^^^^^^^^^^^^^^^",
        "KeyboardInterrupt",
    ]
    result = rank_tracebacks({0: RANK0, 1: interrupted}, {1: 0, 0: 1})
    assert [(t.rank, t.exception, t.cascade) for t in result] == [
        (0, "ValueError: bad batch", False),
        (1, "KeyboardInterrupt", True),
    ]


def test_nothing_to_show():
    assert rank_tracebacks({}, {}) == []
    assert rank_tracebacks({0: ["step 1"], 1: []}, {0: 0}) == []
