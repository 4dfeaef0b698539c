"""The stop's options on launch and submit (a bad one is a usage error before anything
runs; the ranks' environment names the stop), and `orch stop` on records: it asks a running
head through the run directory and waits for it, and refuses a job with nothing to save."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.cli.jobs.job_printing import PipelinePrinter
from orchestrator.outcome.states import JobState
from orchestrator.records.job import JobRecord, finished, process_start_time
from orchestrator.records.rundir import RunDir
from orchestrator.run.stop import request_stop


def _hostfile(tmp_path: Path) -> str:
    path = tmp_path / "hostfile"
    path.write_text("a1 slots=2\na2 slots=2\n")
    return str(path)


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [("--stop-signal", "SIGNOPE", "--stop-signal 'SIGNOPE' is not a signal"),
     ("--stop-signal", "KILL", "a rank cannot handle it"),
     ("--stop-grace", "0", "--stop-grace 0: the ranks' time to save must be more than 0 s"),
     ("--stop-grace", "-3", "must be more than 0 s"),
     ("--time-limit", "2 hours", "--time-limit '2 hours' is not a duration"),
     ("--time-limit", "0m", "needs some time")],
)  # fmt: skip
def test_a_bad_stop_option_is_a_usage_error_before_anything_runs(
    tmp_path: Path, orch_here, option: str, value: str, said: str
) -> None:
    runs = tmp_path / "runs"
    result = orch_here(["launch", "--hostfile", _hostfile(tmp_path), option, value, "train.py"],
                       runs)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert said in " ".join(result.stderr.split())
    assert not runs.exists()  # nothing written, nothing run


def test_the_ranks_environment_names_the_stop_signal_and_grace(tmp_path: Path, orch_here) -> None:
    result = orch_here(["launch", "--hostfile", _hostfile(tmp_path), "--stop-signal", "usr1",
                        "--stop-grace", "300", "--time-limit", "2h", "--dry-run", "--json",
                        "train.py"], tmp_path / "runs")  # fmt: skip
    assert result.returncode == 0, result.stderr
    env = json.loads(result.stdout)["env"]
    assert (env["ORCH_STOP_SIGNAL"], env["ORCH_STOP_GRACE"]) == ("SIGUSR1", "300")
    default = orch_here(["launch", "--hostfile", _hostfile(tmp_path), "--dry-run", "--json",
                         "train.py"], tmp_path / "runs")  # fmt: skip
    env = json.loads(default.stdout)["env"]
    assert (env["ORCH_STOP_SIGNAL"], env["ORCH_STOP_GRACE"]) == ("SIGTERM", "120")


def test_a_recipes_stop_is_used_and_the_command_lines_wins(tmp_path: Path, orch_here) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nscript: train.py\nlauncher: torchrun\nstop_signal: SIGINT\n"
                      "stop_grace: 45\ntime_limit: 90m\n")  # fmt: skip
    args = ["submit", str(recipe), "--hostfile", _hostfile(tmp_path), "--dry-run", "--json"]
    env = json.loads(orch_here(args, tmp_path / "runs").stdout)["env"]
    assert (env["ORCH_STOP_SIGNAL"], env["ORCH_STOP_GRACE"]) == ("SIGINT", "45")
    given = orch_here([*args, "--stop-grace", "600"], tmp_path / "runs")
    assert json.loads(given.stdout)["env"]["ORCH_STOP_GRACE"] == "600"


def _record(run: RunDir, *, head_alive: bool, state: JobState = JobState.RUNNING) -> JobRecord:
    pid = os.getpid() if head_alive else 2**22 + 7
    record = JobRecord(id=run.path.name, state=state, launcher="torchrun", command=("x",),
                       hosts=("n1",), workdir="/", started_at="2026-01-01T00:00:00+00:00",
                       head_pid=pid, head_start=process_start_time(pid) if head_alive else "1")
    run.create()
    run.save(record)
    run.write_file("env.json", json.dumps({"ORCH_STOP_GRACE": "30"}))
    return record


def test_orch_stop_asks_the_running_head_and_waits_for_the_job_to_end(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "runs" / "job-1")
    record = _record(run, head_alive=True)

    def head() -> None:  # the head sees the marker, stops the job, records its end
        while not run.stop_marker.exists():
            time.sleep(0.05)
        time.sleep(0.3)
        run.save(finished(replace(record, state=JobState.STOPPED, exit_code=143)))

    threading.Thread(target=head, daemon=True).start()
    said: list[str] = []
    asked = request_stop(run, say=said.append)
    assert asked.ended and asked.record.state == JobState.STOPPED
    assert said == ["job job-1: stop requested; its ranks get the stop signal and up to 30 s "
                    "to save and exit"]  # fmt: skip


@pytest.mark.parametrize(
    ("alive", "state", "said"),
    [(True, JobState.SUCCEEDED, "job job-1 has ended (succeeded): nothing to stop"),
     (False, JobState.RUNNING, "job job-1 has no head running it")],
)  # fmt: skip
def test_orch_stop_refuses_a_job_with_nothing_left_to_save(
    tmp_path: Path, orch_here, alive: bool, state: JobState, said: str
) -> None:
    runs = tmp_path / "runs"
    _record(RunDir(runs / "job-1"), head_alive=alive, state=state)
    result = orch_here(["stop", "job-1"], runs)
    assert result.returncode == 1
    assert said in " ".join(result.stderr.split())
    assert not (runs / "job-1" / "stop-requested").exists()


def test_the_batch_scripts_own_submit_is_given_the_stop_options_as_given() -> None:
    from orchestrator.plan.request import JobRequest, LaunchSpec, WatchRequest
    from orchestrator.plan.sbatch_script import submit_argv
    from orchestrator.specs.stop import duration_seconds

    watch = WatchRequest(time_limit=duration_seconds("2h"), stop_signal="usr1", stop_grace=300)
    argv = submit_argv(JobRequest(spec=LaunchSpec("t.py"), watch=watch), python="/py",
                       recipe="/r.yaml", job_id="j1", runs_dir="/runs")  # fmt: skip
    text = " ".join(argv)
    assert "--stop-signal usr1 --stop-grace 300 --time-limit 7200.0" in text
    assert duration_seconds("7200.0") == 7200
    plain = submit_argv(JobRequest(spec=LaunchSpec("t.py")), python="/py", recipe="/r.yaml",
                        job_id="j1", runs_dir="/runs")  # fmt: skip
    assert not any(word.startswith(("--stop", "--time-limit")) for word in plain)


def test_orch_status_says_why_the_job_stopped_and_how_each_rank_ended(
    tmp_path: Path, orch_here
) -> None:
    from orchestrator.outcome.rank_ends import RankEnd
    from orchestrator.outcome.states import StopCause
    from orchestrator.outcome.stop import StopEnding, stop_summary
    from orchestrator.specs.stop import StopSettings

    runs = tmp_path / "runs"
    run = RunDir(runs / "job-1")
    record = _record(run, head_alive=False)
    ends = [RankEnd("n1", 0, 1041.0, 0), RankEnd("n1", 1, 1130.0, -9)]
    stop = stop_summary(StopCause.TIME_LIMIT, 1000.0, StopSettings(), ending=StopEnding.GRACE_OVER,
                        torn_down_at=1120.0, world_size=2, ends=ends, signalled={},
                        unreached={})  # fmt: skip
    run.save(finished(replace(record, state=JobState.STOPPED, exit_code=124, stop=stop)))
    result = orch_here(["status", "job-1"], runs)
    assert result.returncode == 0, result.stderr
    assert "job job-1: stopped" in result.stdout
    said = "stopped by the time limit: 1 of 2 ranks exited by themselves within 41 s"
    assert said in result.stdout
    assert "killed at the end of the 120 s grace: rank 1 on n1" in result.stdout
    doc = json.loads(orch_here(["status", "job-1", "--json"], runs).stdout)
    assert doc["stop"]["cause"] == "time-limit" and doc["stop"]["ranks"][1]["end"] == "killed"


def test_an_allocation_ending_before_the_grace_fits_is_a_warning_with_the_numbers(capsys):
    PipelinePrinter().slurm_limit(left=100.0, stop_after=0.0, grace=120.0)
    said = capsys.readouterr().err
    assert said.startswith("warning: the Slurm allocation ends in 100 s, less than the ranks' "
                           "grace of 120 s and the teardown: they are asked to save at once")
    assert "sbatch --time" in said and "--stop-grace" in said
    PipelinePrinter().slurm_limit(left=3600.0, stop_after=3420.0, grace=120.0)
    assert capsys.readouterr().err == ("the Slurm allocation ends in 3600 s: the ranks are "
                                       "asked to save after 3420 s, their grace of 120 s "
                                       "ending before it\n")
