"""Whether a failed attempt is restarted, on values: one case per class, the policy's limits,
the same error twice, and the next attempt's nodes."""

from __future__ import annotations

import pytest

from orchestrator.outcome.restart_policy import (
    LONG_ATTEMPT_S,
    AttemptFailure,
    AttemptProgress,
    FailureClass,
    RestartPolicy,
    classify,
    decide,
    next_nodes,
    pause_before,
)
from orchestrator.outcome.states import HANG_EXIT_CODE, FailureKind

INFRA = RestartPolicy(max_restarts=3)
ANY = RestartPolicy(max_restarts=3, restart_on="any")


def _rank_failure(**facts: object) -> AttemptFailure:
    base: dict[str, object] = dict(kind=FailureKind.RANK, node="n2", rank=3, exit_code=1,
                                   reason="exited with code 1")  # fmt: skip
    return AttemptFailure(**{**base, **facts})  # type: ignore[arg-type]


def _traceback(exception: str, where: str = "train.py", line: int = 41) -> tuple[str, ...]:
    return (
        "Traceback (most recent call last):",
        f'  File "{where}", line {line}, in <module>',
        "    step(batch)",
        exception,
    )


NODE_SILENT = AttemptFailure(FailureKind.SILENT, "n3", None, 1,
                             "stopped answering (no heartbeat for 11 s)")  # fmt: skip
SSH_DROPPED = AttemptFailure(FailureKind.LOST, "n3", None, 1,
                             "lost its ssh connection (ssh exit 255)")  # fmt: skip
# A peer on a healthy node names the failure, but the re-check finds n3 gone.
PEER_OF_A_LOST_NODE = _rank_failure(
    node="n1", rank=0, exception="RuntimeError: Connection closed by peer [127.0.0.3]:4312",
    traceback=_traceback("RuntimeError: Connection closed by peer [127.0.0.3]:4312"),
    unreachable=("n3",),
)
HANG = AttemptFailure(
    FailureKind.HANG, "n2", 3, HANG_EXIT_CODE,
    "hang: no rank wrote anything for 31 s; stands apart: rank 3 on n2",
)  # fmt: skip
OOM = _rank_failure(exit_code=137, reason="killed by the OOM killer (SIGKILL)", signal="SIGKILL",
                    oom_kill=True)  # fmt: skip
SEGFAULT = _rank_failure(exit_code=139, reason="killed by SIGSEGV", signal="SIGSEGV")
NCCL = _rank_failure(
    exception="torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
    "remote process exited or there was a network error, NCCL version 2.21.5",
    traceback=_traceback("torch.distributed.DistBackendError: NCCL error ... ncclRemoteError"),
)
STORE_TIMEOUT = _rank_failure(
    exception="torch.distributed.DistStoreError: Timed out after 901 seconds waiting for "
    "clients. 3/4 clients joined.",
    traceback=_traceback("torch.distributed.DistStoreError: Timed out after 901 seconds"),
)
ECC = _rank_failure(
    exception="RuntimeError: CUDA error: uncorrectable ECC error encountered",
    traceback=_traceback("RuntimeError: CUDA error: uncorrectable ECC error encountered"),
)
OWN_EXCEPTION = _rank_failure(
    exception="ValueError: batch 17 is corrupt",
    traceback=_traceback("ValueError: batch 17 is corrupt"),
)
OWN_EXIT_CODE = _rank_failure(exit_code=7, reason="exited with code 7")
AGENT_NEVER_RAN = AttemptFailure(FailureKind.LOST, "n2", None, 127,
                                 "the remote command failed with exit code 127")  # fmt: skip
SLURM_TOOK_IT = AttemptFailure(FailureKind.LOST, "n2", None, 143,
                               "Slurm took n2 out: down (reason: ECC errors on GPU 3)")  # fmt: skip
INTERRUPTED = AttemptFailure(FailureKind.SIGNAL, "", None, 130, "interrupted by SIGINT")
TIMED_OUT = AttemptFailure(FailureKind.STOPPED, "", None, 124, "stopped by the time limit")


@pytest.mark.parametrize(
    ("failure", "expected", "at_fault"),
    [
        (NODE_SILENT, FailureClass.NODE_LOST, ("n3",)),
        (SSH_DROPPED, FailureClass.NODE_LOST, ("n3",)),
        (PEER_OF_A_LOST_NODE, FailureClass.NODE_LOST, ("n3",)),
        (SLURM_TOOK_IT, FailureClass.NODE_LOST, ("n2",)),
        (HANG, FailureClass.HANG, ()),
        (OOM, FailureClass.SIGNAL, ()),
        (SEGFAULT, FailureClass.SIGNAL, ()),
        (NCCL, FailureClass.TRANSIENT, ()),
        (STORE_TIMEOUT, FailureClass.TRANSIENT, ()),
        (ECC, FailureClass.TRANSIENT, ("n2",)),
        (OWN_EXCEPTION, FailureClass.SCRIPT, ()),
        (OWN_EXIT_CODE, FailureClass.SCRIPT, ()),
        (AGENT_NEVER_RAN, FailureClass.SCRIPT, ()),
        (INTERRUPTED, FailureClass.STOPPED, ()),
        (TIMED_OUT, FailureClass.STOPPED, ()),
    ],
)
def test_each_failure_has_its_class_and_the_nodes_at_fault(failure, expected, at_fault):
    cause = classify(failure)
    assert cause.failure_class == expected
    assert cause.at_fault == at_fault


def test_the_cause_names_the_node_and_rank():
    assert classify(OOM).message == "n2 rank 3: killed by the OOM killer (SIGKILL)"
    assert classify(OWN_EXCEPTION).message == "n2 rank 3: ValueError: batch 17 is corrupt"
    assert classify(PEER_OF_A_LOST_NODE).message == "node lost: n3 (did not answer the re-check)"
    assert classify(NODE_SILENT).message.startswith("node lost: n3 (stopped answering")


@pytest.mark.parametrize("failure", [NODE_SILENT, HANG, OOM, SEGFAULT, NCCL, ECC])
def test_infrastructure_faults_are_restarted(failure):
    decision = decide(failure, INFRA, restarts_done=0)
    assert decision.restart
    assert decision.why.startswith(f"{classify(failure).failure_class}: ")
    assert "restarting (3 restart(s) left)" in decision.why


@pytest.mark.parametrize("failure", [OWN_EXCEPTION, OWN_EXIT_CODE])
def test_the_scripts_own_error_is_restarted_only_when_asked(failure):
    decision = decide(failure, INFRA, restarts_done=0)
    assert not decision.restart
    assert decision.why.startswith("script: the script's own error; not restarted")
    assert "--restart-on any" in decision.why
    assert decide(failure, ANY, restarts_done=0).restart


def test_a_stop_on_the_head_is_never_restarted():
    decision = decide(INTERRUPTED, ANY, restarts_done=0)
    assert not decision.restart and decision.why == "stopped: stopped on purpose; not restarted"


def test_a_stop_for_its_ranks_to_save_is_never_restarted():
    decision = decide(TIMED_OUT, ANY, restarts_done=0)
    assert not decision.restart and decision.why == "stopped: stopped on purpose; not restarted"
    assert classify(TIMED_OUT).message == "stopped by the time limit"


def test_no_restart_without_max_restarts_and_none_past_it():
    assert not decide(HANG, RestartPolicy(), restarts_done=0).restart
    assert "--max-restarts is 0" in decide(HANG, RestartPolicy(), restarts_done=0).why
    used = decide(HANG, INFRA, restarts_done=3)
    assert not used.restart and "all 3 restart(s) used" in used.why


def test_the_same_error_at_the_same_line_twice_stops_whatever_the_policy():
    first = decide(NCCL, ANY, restarts_done=0)
    assert first.restart
    again = decide(NCCL, ANY, restarts_done=1, previous=first.cause)
    assert not again.restart
    assert "DistBackendError at train.py:41 on two attempts in a row" in again.why
    elsewhere = _rank_failure(exception=NCCL.exception,
                              traceback=_traceback(NCCL.exception or "", line=90))  # fmt: skip
    assert decide(elsewhere, ANY, restarts_done=1, previous=first.cause).restart


def test_a_segfault_at_the_same_python_frame_twice_stops():
    crash = _rank_failure(exit_code=139, reason="killed by SIGSEGV", signal="SIGSEGV",
                          hint="SIGSEGV in native code at /w/train.py:88 in forward")  # fmt: skip
    first = decide(crash, INFRA, restarts_done=0)
    assert first.restart and first.cause.where == ("SIGSEGV", "/w/train.py:88")
    again = decide(crash, INFRA, restarts_done=1, previous=first.cause)
    assert not again.restart and "SIGSEGV at /w/train.py:88 on two attempts" in again.why


TORCH_C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _nccl_at_torchs_line(node: str, rank: int, error: str) -> AttemptFailure:
    """An NCCL fault as every one is raised: at torch's own line, whatever went wrong."""
    exception = (f"torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:"
                 f"1970, {error}, NCCL version 2.21.5")  # fmt: skip
    return _rank_failure(node=node, rank=rank, exception=exception, traceback=(
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 60, in <module>',
        "    dist.all_reduce(loss)",
        f'  File "{TORCH_C10D}", line 2501, in all_reduce',
        "    work = group.allreduce([tensor], opts)",
        exception,
    ))  # fmt: skip


REMOTE_ON_N2 = _nccl_at_torchs_line("n2", 3, "remote process exited (ncclRemoteError)")
SYSTEM_ON_N1 = _nccl_at_torchs_line("n1", 0, "unhandled system error (ncclSystemError)")
FIVE = RestartPolicy(max_restarts=5)


def test_nccl_faults_at_torchs_line_with_progress_in_between_are_restarted():
    first = decide(REMOTE_ON_N2, FIVE, restarts_done=0, progress=AttemptProgress(400, 95.0))
    assert first.restart and first.cause.where == ("DistBackendError", f"{TORCH_C10D}:2501")
    again = decide(SYSTEM_ON_N1, FIVE, restarts_done=1, previous=first.cause,
                   progress=AttemptProgress(812, 90.0),
                   previous_progress=AttemptProgress(400, 95.0))  # fmt: skip
    assert again.restart
    assert again.why == (
        "transient: a known transient fault of the communication stack or GPU; restarting "
        f"(4 restart(s) left): DistBackendError at {TORCH_C10D}:2501 again, but the job got "
        "further (it reached step 812, the attempt before reached step 400)"
    )


def test_nccl_faults_at_torchs_line_with_no_progress_in_between_end_the_job():
    first = decide(REMOTE_ON_N2, FIVE, restarts_done=0, progress=AttemptProgress(400, 95.0))
    again = decide(SYSTEM_ON_N1, FIVE, restarts_done=1, previous=first.cause,
                   progress=AttemptProgress(400, 40.0),
                   previous_progress=AttemptProgress(400, 95.0))  # fmt: skip
    assert not again.restart
    assert again.why == (
        "transient: a known transient fault of the communication stack or GPU; not "
        f"restarted: DistBackendError at {TORCH_C10D}:2501 on two attempts in a row with no "
        "progress in between (it reached step 400, the attempt before step 400; it ran 40 s) "
        "is not a passing fault"
    )
    silent = decide(SYSTEM_ON_N1, FIVE, restarts_done=1, previous=first.cause,
                    progress=AttemptProgress(None, 3.0))  # fmt: skip
    assert not silent.restart
    assert "(no rank showed a step; it ran 3 s)" in silent.why


def test_an_attempt_that_ran_a_good_while_is_not_a_repeat_whatever_its_step():
    # No checkpoint: the second attempt started again from step 0 and failed before 400.
    before = AttemptProgress(400, 95.0)
    long_run = AttemptProgress(250, LONG_ATTEMPT_S + 60)
    first = decide(REMOTE_ON_N2, FIVE, restarts_done=0, progress=before)
    again = decide(SYSTEM_ON_N1, FIVE, restarts_done=1, previous=first.cause,
                   progress=long_run, previous_progress=before)  # fmt: skip
    assert again.restart and again.why.endswith("again, but the job got further (it ran 11 min "
                                                "first)")  # fmt: skip
    short_run = AttemptProgress(250, LONG_ATTEMPT_S - 60)
    assert not decide(SYSTEM_ON_N1, FIVE, restarts_done=1, previous=first.cause,
                      progress=short_run, previous_progress=before).restart  # fmt: skip


def test_a_first_step_after_an_attempt_that_showed_none_is_progress():
    first = decide(REMOTE_ON_N2, FIVE, restarts_done=0)  # failed while setting up
    again = decide(SYSTEM_ON_N1, FIVE, restarts_done=1, previous=first.cause,
                   progress=AttemptProgress(3, 20.0))  # fmt: skip
    assert again.restart and "(it reached step 3, the attempt before showed no step)" in again.why


def test_progress_does_not_lift_the_restart_limit():
    first = decide(REMOTE_ON_N2, FIVE, restarts_done=4, progress=AttemptProgress(400, 95.0))
    last = decide(SYSTEM_ON_N1, FIVE, restarts_done=5, previous=first.cause,
                  progress=AttemptProgress(812, 90.0),
                  previous_progress=AttemptProgress(400, 95.0))  # fmt: skip
    assert not last.restart and "all 5 restart(s) used" in last.why


def test_a_segfault_at_the_same_python_frame_after_progress_is_restarted():
    crash = _rank_failure(exit_code=139, reason="killed by SIGSEGV", signal="SIGSEGV",
                          hint="SIGSEGV in native code at /w/train.py:88 in forward")  # fmt: skip
    first = decide(crash, INFRA, restarts_done=0, progress=AttemptProgress(100, 50.0))
    again = decide(crash, INFRA, restarts_done=1, previous=first.cause,
                   progress=AttemptProgress(180, 50.0),
                   previous_progress=AttemptProgress(100, 50.0))  # fmt: skip
    assert again.restart and "SIGSEGV at /w/train.py:88 again, but the job got" in again.why
    stuck = decide(crash, INFRA, restarts_done=1, previous=first.cause,
                   progress=AttemptProgress(100, 50.0),
                   previous_progress=AttemptProgress(100, 50.0))  # fmt: skip
    assert not stuck.restart and "SIGSEGV at /w/train.py:88 on two attempts" in stuck.why


def test_two_lost_nodes_in_a_row_are_not_the_same_error():
    first = decide(NODE_SILENT, INFRA, restarts_done=0)
    assert decide(SSH_DROPPED, INFRA, restarts_done=1, previous=first.cause).restart


def test_the_pause_grows_and_is_bounded():
    assert pause_before(0) < pause_before(1) < pause_before(2)
    assert pause_before(100) == 30.0


POOL = ("n1", "n2", "n3", "n4", "n5")


def test_a_spare_replaces_a_dropped_node_in_the_pools_order():
    nodes = next_nodes(POOL, ("n1", "n2", "n3"), ("n2",), wanted=3, minimum=3)
    assert nodes.nodes == ("n1", "n3", "n4") and nodes.problem is None


def test_without_spares_the_job_shrinks_down_to_min_nodes():
    pool = ("n1", "n2", "n3", "n4")
    assert next_nodes(pool, pool, ("n4",), wanted=4, minimum=2).nodes == ("n1", "n2", "n3")
    short = next_nodes(pool, pool, ("n2", "n3", "n4"), wanted=4, minimum=2)
    assert short.nodes == ()
    assert short.problem == ("1 healthy node(s) left (n1), fewer than the 2 the job needs "
                             "(--min-nodes); dropped: n2, n3, n4")  # fmt: skip


def test_a_restart_that_cannot_start_ends_the_job_with_the_last_attempts_code():
    from orchestrator.errors import OrchError, RestartNotStarted

    why = OrchError("node2: writing the job's settings failed", "check SSH to node2")
    ended = RestartNotStarted(1, why, 137)
    assert ended.exit_code == 137 and ended.hint == "check SSH to node2"
    assert str(ended) == ("attempt 2 could not start (node2: writing the job's settings failed);"
                          " the job ends with attempt 1's exit code 137")  # fmt: skip
