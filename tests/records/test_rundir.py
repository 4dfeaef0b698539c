"""The job's directory held open (records/rundir.py): a runs directory that is not the user's
own is refused at the launch as on reading, a link planted once the job's directory is made
is never written through, and `orch kill` reads no record before the one it checked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.errors import OrchError
from orchestrator.logs.router import LogRouter
from orchestrator.records.job import JOB_FILE, LOGS_DIR, MOMENTS_FILE, JobRecord, runs_root
from orchestrator.records.moments import Moment, MomentKind, append_moments
from orchestrator.records.rundir import APPEND, RunDir, find_job, run_dir
from orchestrator.remote.owned import owner_name

JOB = "20261121-230000-abc123"
ME = os.getuid()
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")


def _record(job_id: str = JOB) -> JobRecord:
    return JobRecord(id=job_id, state="running", launcher="pdsh", command=("t.py",),
                     hosts=("n1",), workdir="/tmp", started_at="2026-11-21T23:00:00+00:00",
                     head_pid=0, head_start=None)  # fmt: skip


def _hostfile(tmp_path: Path) -> str:
    path = tmp_path / "hostfile"
    path.write_text("a1 slots=1\na2 slots=1\n")
    return str(path)


# ----- refused at the launch, as on reading ---------------------------------------------
def test_a_runs_directory_others_can_write_is_refused_when_the_job_is_made(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o775)
    runs.chmod(0o775)  # made by hand under a umask of 002
    with pytest.raises(OrchError, match=f"{runs} .*mode 0775.* writable by others") as err:
        run_dir(runs, JOB).create()
    assert err.value.hint == f"chmod go-w -- {runs}, and run again"
    assert not (runs / JOB).exists()


def test_a_link_as_the_runs_directory_is_refused_not_followed(tmp_path):
    mine = tmp_path / "elsewhere"
    mine.mkdir()
    (tmp_path / "runs").symlink_to(mine)
    runs = runs_root(tmp_path / "runs")
    assert runs == tmp_path / "runs"  # named as given: the link is not resolved away
    with pytest.raises(OrchError, match=f"{runs} .*symbolic link"):
        run_dir(runs, JOB).create()
    assert list(mine.iterdir()) == []


@AS_ROOT
def test_a_runs_directory_another_user_made_first_is_refused_when_the_job_is_made(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o755)
    os.chown(runs, 65534, 65534)  # nobody's: made first, in a project directory both can write
    with pytest.raises(OrchError, match=f"{runs} .*uid 65534.*another user") as err:
        run_dir(runs, JOB).create()
    assert "--runs-dir" in err.value.hint
    assert not (runs / JOB).exists()


def _launch_refused(orch_here, monkeypatch, tmp_path: Path, runs: Path):
    """`orch launch` on a runs directory it must refuse: refused before the nodes are
    touched (the pre-flight would be the first thing to reach them)."""

    def reached(*_args, **_kwargs):
        raise AssertionError("the nodes were reached before the runs directory was checked")

    monkeypatch.setattr("orchestrator.run.job.ready_nodes", reached)
    argv = ["launch", "--hostfile", _hostfile(tmp_path), "--launcher", "torchrun", "--quiet",
            "train.py"]  # fmt: skip
    return orch_here(argv, runs)


def test_launch_refuses_a_group_writable_runs_directory_before_anything_starts(
    tmp_path, orch_here, monkeypatch
):
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o775)
    result = _launch_refused(orch_here, monkeypatch, tmp_path, runs)
    assert result.returncode == 73, result.stderr
    said = f"{runs} (owner {owner_name(ME)}, mode 0775) is writable by others"
    assert said in result.stderr and f"chmod go-w -- {runs}" in result.stderr
    assert list(runs.iterdir()) == []


def test_launch_refuses_a_link_as_the_runs_directory(tmp_path, orch_here, monkeypatch):
    mine = tmp_path / "elsewhere"
    mine.mkdir()
    (tmp_path / "runs").symlink_to(mine)
    result = _launch_refused(orch_here, monkeypatch, tmp_path, tmp_path / "runs")
    assert result.returncode == 73, result.stderr
    assert f"{tmp_path / 'runs'} " in result.stderr and "symbolic link" in result.stderr
    assert list(mine.iterdir()) == []


@AS_ROOT
def test_launch_refuses_a_runs_directory_another_user_owns(tmp_path, orch_here, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o755)
    os.chown(runs, 65534, 65534)
    result = _launch_refused(orch_here, monkeypatch, tmp_path, runs)
    assert result.returncode == 73, result.stderr
    said = f"{runs} (owner {owner_name(65534)}, mode 0755) belongs to another user"
    assert said in result.stderr and "--runs-dir" in result.stderr


def test_a_job_directory_that_exists_already_is_not_taken_for_a_new_job(tmp_path):
    runs = tmp_path / "runs"
    (runs / JOB).mkdir(parents=True)  # made first, by whoever learnt the id
    with pytest.raises(OrchError, match="exists already"):
        run_dir(runs, JOB).create()
    run = run_dir(runs, JOB).create(existing=True)  # a batch job's, made by its submit
    run.save(_record())
    assert run.load() == _record()


# ----- never written through a link planted later ---------------------------------------
def _swapped(run: RunDir, tmp_path: Path) -> tuple[Path, Path]:
    """The job's directory moved away mid-job and a link to a directory of the planter's
    put in its place, whose temporary name and log point at a file outside (the user's
    ~/.bashrc, say). Returns where the directory went and the file outside."""
    outside = tmp_path / "bashrc"
    outside.write_text("# the user's own\n")
    moved = tmp_path / "moved"
    run.path.rename(moved)
    theirs = tmp_path / "theirs"
    (theirs / LOGS_DIR).mkdir(parents=True)
    for name in (f".{JOB_FILE}.tmp", JOB_FILE, MOMENTS_FILE, f"{LOGS_DIR}/n1.log"):
        (theirs / name).symlink_to(outside)
    run.path.symlink_to(theirs)
    return moved, outside


def test_a_job_directory_swapped_for_a_link_mid_job_is_not_written_through(tmp_path):
    run = run_dir(tmp_path / "runs", JOB).create()
    run.save(_record())
    moved, outside = _swapped(run, tmp_path)

    run.save(_record())
    run.write_file("env.json", "{}\n")
    append_moments(run, [Moment(1.0, MomentKind.START)])
    router = LogRouter(run.logs, open_log=lambda name: run.open(f"{LOGS_DIR}/{name}", APPEND))
    router.feed_lines([b"n1: plain output"])
    router.close()

    assert outside.read_text() == "# the user's own\n"
    assert json.loads((moved / JOB_FILE).read_text())["id"] == JOB  # where it was made
    assert (moved / "env.json").read_text() == "{}\n"
    assert (moved / MOMENTS_FILE).read_text().count('"start"') == 1
    assert "plain output" in (moved / LOGS_DIR / "n1.log").read_text()
    assert run.load() == _record()  # read from the directory it holds


def test_a_temporary_name_planted_as_a_link_is_removed_not_written_through(tmp_path):
    run = run_dir(tmp_path / "runs", JOB).create()
    outside = tmp_path / "bashrc"
    outside.write_text("# the user's own\n")
    (run.path / f".{JOB_FILE}.tmp").symlink_to(outside)
    run.save(_record())
    assert outside.read_text() == "# the user's own\n"
    assert not (run.path / f".{JOB_FILE}.tmp").exists()
    assert run.job_file.is_file() and not run.job_file.is_symlink()
    assert RunDir(run.path).load() == _record()


def test_a_job_file_that_is_a_link_is_refused_not_read(tmp_path):
    run = run_dir(tmp_path / "runs", JOB).create()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(_record().to_json()))
    run.job_file.symlink_to(elsewhere)
    with pytest.raises(OrchError, match=f"{run.job_file} .*symbolic link"):
        run.load()


# ----- found without reading others ---------------------------------------------------------
def _runs_with_others(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    for job_id in ("20261121-220000-aaaaaa", JOB, "20261121-235900-cccccc"):
        with run_dir(runs, job_id).create() as run:
            run.save(_record(job_id))
    return runs


def _parsed(monkeypatch) -> list[str]:
    """The ids of the records parsed from now on."""
    parsed: list[str] = []
    original = JobRecord.from_json

    def counting(data):
        parsed.append(str(data.get("id")))
        return original(data)

    monkeypatch.setattr(JobRecord, "from_json", staticmethod(counting))
    return parsed


def test_kill_refuses_a_record_others_can_write_without_reading_any_other(
    tmp_path, orch_here, monkeypatch
):
    runs = _runs_with_others(tmp_path)
    (runs / JOB / JOB_FILE).chmod(0o666)
    parsed = _parsed(monkeypatch)
    result = orch_here(["kill", JOB, "--grace", "0"], runs)
    assert result.returncode == 1
    assert f"{runs / JOB / JOB_FILE} " in result.stderr and "writable by others" in result.stderr
    assert parsed == []


def test_kill_refuses_a_runs_directory_others_can_write_before_reading_any_record(
    tmp_path, orch_here, monkeypatch
):
    runs = _runs_with_others(tmp_path)
    runs.chmod(0o777)
    parsed = _parsed(monkeypatch)
    result = orch_here(["kill", JOB, "--grace", "0"], runs)
    assert result.returncode == 1
    assert f"{runs} (owner {owner_name(ME)}, mode 0777) is writable by others" in result.stderr
    assert parsed == []


def test_a_job_is_found_by_its_directorys_name_reading_no_record(tmp_path, monkeypatch):
    runs = _runs_with_others(tmp_path)
    parsed = _parsed(monkeypatch)
    with find_job(runs, "20261121-230") as run:
        assert run.path == runs / JOB
    with find_job(runs, None) as newest:
        assert newest.path.name == "20261121-235900-cccccc"
    assert parsed == []


@pytest.mark.process
def test_a_batch_jobs_record_is_the_users_alone_whatever_the_umask(tmp_path, orch_here,
                                                                    monkeypatch):
    monkeypatch.setattr("orchestrator.run.batch.submit_batch", lambda _script, cwd: "4242")
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "cpu-smoke-slurm.yaml"
    runs = tmp_path / "runs"
    old = os.umask(0o002)  # a cluster's usual umask for shared project groups
    try:
        submitted = orch_here(["submit", str(recipe), "--sbatch"], runs)
    finally:
        os.umask(old)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    for name in (JOB_FILE, "sbatch.sh"):
        assert (runs / job_id / name).stat().st_mode & 0o777 == 0o600
    listed = orch_here(["status", "--json"], runs)
    assert [job["id"] for job in json.loads(listed.stdout)["jobs"]] == [job_id]
    shown = orch_here(["status", job_id], runs)
    assert shown.returncode == 0, shown.stderr


def test_a_runs_directory_that_cannot_be_made_is_an_error_that_says_why(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OrchError) as caught:
        RunDir(tmp_path / "a-file" / "runs" / "j1").create()
    assert caught.value.message == (f"the runs directory {tmp_path}/a-file/runs cannot be "
                                    f"made: File exists ({tmp_path}/a-file)")  # fmt: skip
    assert "--runs-dir DIR" in caught.value.hint
