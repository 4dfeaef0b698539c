"""Records trusted only when they are the user's own (records/ownership.py): on values, then on
real directories, then through `orch logs` and `orch stacks`."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.errors import OrchError
from orchestrator.records import ownership
from orchestrator.records.job import KILL_MARKER, JobRecord
from orchestrator.records.rundir import RunDir
from orchestrator.remote.owned import owner_name
from orchestrator.run.teardown import kill_job

JOB = "20261121-230000-abc123"
ME = 1000


def _stat(kind: int, mode: int, uid: int) -> os.stat_result:
    return os.stat_result((kind | mode, 1, 1, 1, uid, 0, 0, 0, 0, 0))


def test_a_directory_or_record_of_the_users_own_is_trusted() -> None:
    runs = Path("/home/a/runs")
    for mode in (0o700, 0o755, 0o1755):
        mine = _stat(stat.S_IFDIR, mode, ME)
        assert ownership.record_problem(runs, mine, ME, directory=True) is None
    record = _stat(stat.S_IFREG, 0o644, ME)
    assert ownership.record_problem(runs / "j" / "job.json", record, ME, directory=False) is None


@pytest.mark.parametrize(
    ("kind", "mode", "uid", "directory", "said", "fix"),
    [
        (stat.S_IFDIR, 0o700, 4242, True, "belongs to another user", "a runs directory that"),
        (stat.S_IFDIR, 0o1777, 0, True, "belongs to another user", "--runs-dir"),
        (stat.S_IFDIR, 0o775, ME, True, "writable by others", "chmod go-w -- /r"),
        (stat.S_IFDIR, 0o757, ME, True, "writable by others", "chmod go-w -- /r"),
        (stat.S_IFLNK, 0o777, ME, True, "symbolic link", "ORCH_RUNS_DIR"),
        (stat.S_IFREG, 0o600, ME, True, "not a directory", "--runs-dir"),
        (stat.S_IFDIR, 0o700, ME, False, "not a regular file", "--runs-dir"),
        (stat.S_IFREG, 0o666, ME, False, "writable by others", "chmod go-w -- /r"),
        (stat.S_IFREG, 0o600, 4242, False, "belongs to another user", "--runs-dir"),
    ],
)
def test_what_is_refused_names_the_path_owner_mode_and_fix(kind, mode, uid, directory, said, fix):
    problem = ownership.record_problem(Path("/r"), _stat(kind, mode, uid), ME, directory=directory)
    assert problem is not None
    assert problem.message.startswith(f"/r (owner {owner_name(uid)}, mode {mode:04o}) ")
    assert said in problem.message and fix in problem.fix
    assert "\n" not in problem.line


def _job(runs: Path) -> RunDir:
    run = RunDir(runs / JOB).create()
    run.save(JobRecord(id=JOB, state="running", launcher="pdsh", command=("t.py",),
                       hosts=("n1",), workdir="/tmp", started_at="2026-11-21T23:00:00+00:00",
                       head_pid=0, head_start=None))  # fmt: skip
    return run


def test_real_paths_the_user_owns_pass_and_loose_ones_are_refused(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = _job(runs)
    ownership.check_runs_root(runs)
    ownership.check_job(run)
    ownership.check_runs_root(tmp_path / "none")  # missing: the caller says there is no job
    run.job_file.chmod(0o666)
    with pytest.raises(OrchError, match=f"{run.job_file} .*mode 0666.* writable by others"):
        ownership.check_job(run)
    run.job_file.chmod(0o600)
    runs.chmod(0o777)
    with pytest.raises(OrchError, match=f"{runs} .*mode 0777.* writable by others") as err:
        ownership.check_runs_root(runs)
    assert err.value.hint == f"chmod go-w -- {runs}, and run again"


def test_a_job_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = _job(tmp_path / "elsewhere")
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / JOB).symlink_to(elsewhere.path)
    with pytest.raises(OrchError, match="symbolic link"):
        ownership.check_job(RunDir(runs / JOB))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_another_users_runs_directory_is_refused(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _job(runs)
    os.chown(runs, 65534, 65534)  # nobody's
    with pytest.raises(OrchError, match=f"{runs} .*uid 65534.*another user"):
        ownership.check_runs_root(runs)


@pytest.mark.parametrize("command", [["logs", JOB], ["stacks", JOB]])
def test_logs_and_stacks_refuse_a_runs_directory_others_can_write(tmp_path, orch_here, command):
    runs = tmp_path / "runs"
    _job(runs)
    runs.chmod(0o777)
    result = orch_here([*command, "--runs-dir", str(runs)], runs)
    assert result.returncode == 1
    said = f"{runs} (owner {owner_name(os.getuid())}, mode 0777) is writable by others"
    assert said in result.stderr
    assert f"chmod go-w -- {runs}" in result.stderr


@pytest.mark.parametrize("command", [["logs", JOB], ["stacks", JOB]])
def test_logs_and_stacks_refuse_a_record_others_can_write(tmp_path, orch_here, command):
    runs = tmp_path / "runs"
    run = _job(runs)
    run.job_file.chmod(0o646)
    result = orch_here([*command, "--runs-dir", str(runs)], runs)
    assert result.returncode == 1
    assert "writable by others" in result.stderr and f"{run.job_file} " in result.stderr


def test_kill_refuses_a_record_others_can_write_before_acting_on_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = _job(runs)
    run.job_file.chmod(0o666)
    said: list[str] = []
    with pytest.raises(OrchError, match="writable by others"):
        kill_job(run, grace=1.0, say=said.append)
    assert said == [] and not (run.path / KILL_MARKER).exists()
    run.job_file.chmod(0o600)
    runs.chmod(0o777)
    with pytest.raises(OrchError, match=f"{runs} .*writable by others"):
        kill_job(run, grace=1.0, say=said.append)
