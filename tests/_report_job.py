"""A failed job's run directory, as orch leaves it, for the report's tests: job.json with
every rank's end, the teardown's stacks, each node's log, and what was kept as it ran: its
moments, every rank's progress (rank STRAGGLER three times slower per step than the others)
and the pre-flight's report."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.outcome.states import FailureKind, JobState
from orchestrator.records.job import FirstFailure, JobRecord, RankRecord
from orchestrator.records.moments import Moment, MomentKind, append_moments, save_preflight
from orchestrator.records.rundir import RunDir
from orchestrator.stacks.model import Frame, NodeReport, RankStacks, ThreadStack
from orchestrator.stacks.report import analyse, result_json

JOB = "20261121-230000-abc123"
T0 = 1_795_000_000.0  # 2026-11-18, on the head's clock
HOSTILE = "<script>alert(1)</script>"
CAUSE_RANK, CAUSE_NODE = 5, "n2"
EXCEPTION = "RuntimeError: CUDA error: an illegal memory access was encountered"
STRAGGLER = 2  # on n1: 0.3 s per step, the others 0.1 s
ODD_TORCH = ("n2", "2.12.0")  # the pre-flight found n2's torch older than the others'


def _role(rank: int) -> str:
    if rank == CAUSE_RANK:
        return "cause"
    return "succeeded" if rank == 0 else "consequence"


def rank_records(nodes: int, per_node: int) -> tuple[RankRecord, ...]:
    ranks = []
    for index in range(nodes * per_node):
        node, local = f"n{index // per_node + 1}", index % per_node
        role = _role(index)
        cause = role == "cause"
        ranks.append(RankRecord(
            node=node, rank=index, local_rank=local, pid=1000 + index,
            start=T0 + 1.0 + 0.2 * (index // per_node % 8), end=T0 + (12.0 if cause else 14.5),
            exit_code=1 if cause else (0 if role == "succeeded" else 143),
            signal=None if role != "consequence" else "SIGTERM", role=role,
        ))  # fmt: skip
    return tuple(ranks)


def _stacks_doc(ranks: tuple[RankRecord, ...]) -> dict:
    def thread(frames: list[tuple[str, str, int]]) -> ThreadStack:
        return ThreadStack("MainThread", None, False, True,
                           tuple(Frame(fn, path, line) for fn, path, line in frames))  # fmt: skip

    waiting = thread([("all_reduce", "/x/site-packages/torch/distributed/c10d.py", 2501),
                      ("train_step", "/work/train.py", 42)])  # fmt: skip
    apart = thread([("save", "/work/train.py", 77), ("main", "/work/train.py", 90)])
    running = [r for r in ranks if r.role != "cause"]
    stacks = tuple(
        RankStacks(r.rank, r.node, r.pid, threads=(apart if r.rank == 0 else waiting,))
        for r in running
    )
    nodes = sorted({r.node for r in running})
    reports = [NodeReport(n, tuple(s for s in stacks if s.node == n)) for n in nodes]
    return result_json(analyse(JOB, "2026-11-18T00:00:14+00:00", None, reports))


def failed_job(
    runs: Path, nodes: int = 2, per_node: int = 4, stacks: bool = True, kept: bool = True
) -> RunDir:
    run = RunDir(runs / JOB).create()
    ranks = rank_records(nodes, per_node)
    hosts = tuple(f"n{i + 1}" for i in range(nodes))
    consequences = sum(r.role == "consequence" for r in ranks)
    cause_node = f"n{CAUSE_RANK // per_node + 1}"
    failure = FirstFailure(
        node=cause_node, rank=CAUSE_RANK, exit_code=1, reason="exited with code 1",
        last_lines=("step 7 loss 2.31", EXCEPTION), kind=FailureKind.RANK,
        root_cause_rank=CAUSE_RANK, root_cause_node=cause_node, root_cause=EXCEPTION,
        traceback=("Traceback (most recent call last):", '  File "train.py", line 42, in <module>',
                   EXCEPTION),
        then=f"then {consequences} ranks failed after losing rank {CAUSE_RANK}",
        hint="a rank's own error: read its traceback",
    )  # fmt: skip
    if stacks:
        run.write_file("stacks/teardown.json", json.dumps(_stacks_doc(ranks)))
    record = JobRecord(
        id=JOB, state=JobState.FAILED, launcher="pdsh",
        command=("python3", "train.py", "--lr", "1"), hosts=hosts, workdir="/work",
        started_at=_iso(T0), head_pid=0, head_start=None,
        ended_at=_iso(T0 + 16), exit_code=1,
        node_exit_codes={h: (1 if h == cause_node else 143) for h in hosts},
        first_failure=failure, node_logs={h: "ok" for h in hosts},
        teardown_stacks="stacks/teardown.json" if stacks else None, ranks=ranks,
    )  # fmt: skip
    run.save(record)
    for host in hosts:
        lines = [f"2026-11-18T00:00:0{i}.000Z r0/0 out step {i} on {host}" for i in range(8)]
        if host == cause_node:
            lines += [f"2026-11-18T00:00:11.000Z r5/1 err {HOSTILE}",
                      f"2026-11-18T00:00:12.000Z r5/1 err {EXCEPTION}"]  # fmt: skip
        (run.logs / f"{host}.log").write_text("\n".join(lines) + "\n")
    if kept:
        _kept_as_it_ran(run, ranks, hosts)
    return run


def _kept_as_it_ran(run: RunDir, ranks: tuple[RankRecord, ...], hosts: tuple[str, ...]) -> None:
    """moments.jsonl, progress.jsonl and preflight.json, as orch writes them."""
    moments = [Moment(T0 + 0.4, MomentKind.START)]
    for rank in ranks:
        moments += [
            Moment(T0 + 1.5, MomentKind.FIRST_OUTPUT, rank.node, rank.rank),
            Moment(rank.end - 0.5, MomentKind.LAST_OUTPUT, rank.node, rank.rank),
        ]
    for host in hosts:
        moments += [
            Moment(T0 + 1.5, MomentKind.FIRST_OUTPUT, host),
            Moment(T0 + 11.5, MomentKind.LAST_OUTPUT, host),
            Moment(T0 + 14.0, MomentKind.LAST_HEARTBEAT, host),
        ]
    moments += [
        Moment(T0 + 12.2, MomentKind.FIRST_FAILURE, _node_of(ranks, CAUSE_RANK), CAUSE_RANK),
        Moment(T0 + 12.3, MomentKind.TEARDOWN_START),
        Moment(T0 + 14.6, MomentKind.TEARDOWN_END),
        Moment(T0 + 15.9, MomentKind.END),
    ]
    append_moments(run, moments)
    samples = []
    for rank in ranks:
        step = 0.3 if rank.rank == STRAGGLER else 0.1
        for second in range(2, 12):
            n = int((second - 1) / step)
            samples.append(
                json.dumps(
                    {
                        "t": T0 + second,
                        "node": rank.node,
                        "rank": rank.rank,
                        "n": n,
                        "total": 200,
                        "rate": round(1 / step, 2),
                    }
                )
            )
    (run.path / "progress.jsonl").write_text("\n".join(samples) + "\n")
    save_preflight(run, T0 - 3.0, T0 - 0.5, _preflight_doc(hosts))


def _node_of(ranks: tuple[RankRecord, ...], number: int) -> str:
    return next(rank.node for rank in ranks if rank.rank == number)


def _preflight_doc(hosts: tuple[str, ...]) -> dict:
    checks = {"ssh": "ok", "python": "ok", "parity": "ok", "disk": "ok"}
    odd, version = ODD_TORCH
    return {
        "ok": True, "seconds": 2.5,
        "nodes": [{"node": h, "reachable": True, "facts": None,
                   "checks": {**checks, "parity": "warning" if h == odd else "ok"}}
                  for h in hosts],
        "findings": [{"node": odd, "check": "parity", "severity": "warning",
                      "problem": f"torch {version} differs from the head's 2.13.0", "fix": "-"}],
        "parity": [{"fact": "torch", "majority": "2.13.0",
                    "differing": [{"node": odd, "value": version}]}],
    }  # fmt: skip


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")
