"""The agent's watch over its node's ranks (remote/rank_watch.py) on fabricated /proc trees:
which processes it takes for ranks as they start, and the ends it reports for ranks whose
keepers could not."""

from __future__ import annotations

import os
import time
from pathlib import Path

from _fake_proc import fake_process

from orchestrator.remote import procs
from orchestrator.remote.rank_watch import RankWatch

JOB, NODE = "job-1", "n1"


def _env(**more: str) -> dict[str, str]:
    return {procs.JOB_ID_VAR: JOB, procs.NODE_VAR: NODE, procs.KEPT_VAR: "1", **more}


def _gone(proc: Path, pid: int) -> None:
    for entry in (proc / str(pid)).iterdir():
        entry.unlink()
    (proc / str(pid)).rmdir()


def test_a_keepers_child_seen_before_its_exec_is_its_rank_after_it(tmp_path: Path) -> None:
    """Between the keeper's fork and the exec, the child has the keeper's environment (RANK,
    no keeper's pid): not a rank yet. After the exec, the same pid is the rank, and when it
    is killed with its keeper (no report from it), its end is still told."""
    proc = tmp_path / "proc"
    proc.mkdir()
    fake_process(proc, 100, 1, _env())  # the launcher
    fake_process(proc, 101, 100, _env(RANK="2"))  # rank 2's keeper
    fake_process(proc, 102, 101, _env(RANK="2"))  # its child, not exec'd yet
    watch = RankWatch(JOB, NODE, str(proc))
    watch.scan()
    assert watch.alive == {}
    fake_process(proc, 102, 101, _env(RANK="2", **{procs.KEEPER_VAR: "101"}))  # the exec
    watch.scan()
    assert watch.alive == {102: 2}
    _gone(proc, 102)
    _gone(proc, 101)
    watch.scan()
    assert [(rank, code) for _at, rank, code in watch.unreported()] == [(2, None)]


def test_a_ranks_own_child_stays_none_of_the_ranks(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    fake_process(proc, 101, 1, _env(RANK="0"))
    fake_process(proc, 102, 101, _env(RANK="0", **{procs.KEEPER_VAR: "101"}))
    fake_process(proc, 103, 102, _env(RANK="0", **{procs.KEEPER_VAR: "101"}))  # a data loader
    watch = RankWatch(JOB, NODE, str(proc))
    watch.scan()
    watch.scan()
    assert watch.alive == {102: 0}
    assert set(watch._not_ranks) == {101, 103}
    _gone(proc, 103)
    watch.scan()
    assert watch.unreported() == []
    assert set(watch._not_ranks) == {101}  # what it remembers of the others: live ones only


def test_the_watch_loop_scans_only_when_the_last_scan_is_old_enough(tmp_path: Path) -> None:
    """Each scan reads every process's environment on the node: the agent's loop asks for
    one five times a second, and gets one when it is due (every 0.2 s without pidfds)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    watch = RankWatch(JOB, NODE, str(proc))
    now = time.monotonic()
    watch.scan_if_due(now)
    fake_process(proc, 101, 1, _env(RANK="0", **{procs.KEEPER_VAR: "1"}))
    watch.scan_if_due(now + 0.05)
    assert watch.alive == {}
    watch.scan_if_due(now + 0.5)
    assert watch.alive == {101: 0}


def test_without_pidfds_in_the_kernel_the_scan_stays_five_times_a_second(monkeypatch) -> None:
    """Python has os.pidfd_open, a kernel before 5.3 refuses it: ends are then seen by the
    scan alone, which keeps its pace."""
    watch = RankWatch(JOB, NODE)
    assert watch._scan_every == RankWatch._SCAN_WITH_PIDFDS_S

    def refused(_pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", refused)
    watch._watch(os.getpid())
    assert watch._scan_every == RankWatch._SCAN_WITHOUT_S
