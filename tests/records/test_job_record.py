"""job.json (records/job.py): what a record keeps of how the job ran, on values."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from orchestrator.outcome.states import JobState
from orchestrator.plan.build import build_plan
from orchestrator.plan.launch_plan import HeadContext, Placement
from orchestrator.plan.request import LaunchSpec
from orchestrator.records.job import JobRecord
from orchestrator.records.rundir import RunDir
from orchestrator.run.plan_files import prepare_run
from orchestrator.specs.inventory import make_hostfile


def _prepared(tmp_path: Path, environ: dict[str, str]) -> JobRecord:
    spec = LaunchSpec("train.py", launcher="torchrun", workdir="/work/x")
    place = Placement(job_id="job-1", hostfile=make_hostfile(["n1", "n2"], 1),
                      run_dir=str(tmp_path / "job-1"), main_port=29511)  # fmt: skip
    head = replace(HeadContext("pdsh", str(tmp_path / "private"), sys.executable), environ=environ)
    run = RunDir(tmp_path / "job-1")
    prepare_run(build_plan(spec, place, head), run)
    return run.load()


def test_the_node_root_the_job_ran_with_is_kept_and_wins_over_the_shells(tmp_path: Path) -> None:
    record = _prepared(tmp_path, {"ORCH_NODE_ROOT": "/scratch/me/orch"})
    saved = json.loads((tmp_path / "job-1" / "job.json").read_text())
    assert saved["node_root"] == "/scratch/me/orch"
    # `orch stacks` from a shell that sets another, or none, still finds the job's nodes.
    assert record.node_root_or("") == record.node_root_or("/elsewhere") == "/scratch/me/orch"


def test_a_job_in_orchs_own_place_stays_there_and_an_older_record_takes_the_shells(
    tmp_path: Path,
) -> None:
    own = _prepared(tmp_path, {})
    assert own.node_root == "" and own.node_root_or("/elsewhere") == ""
    older = JobRecord(id="j", state=JobState.RUNNING, launcher="torchrun", command=(),
                      hosts=(), workdir="/", started_at="", head_pid=1, head_start=None)
    data = older.to_json()
    del data["node_root"]  # written before records kept it
    assert JobRecord.from_json(data).node_root_or("/elsewhere") == "/elsewhere"
