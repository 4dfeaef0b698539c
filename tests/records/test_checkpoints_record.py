"""The job's record of checkpoints (checkpoints.json): written whole and read back as it was,
none for a job without --checkpoint-dir, a malformed file refused naming it; and job.json
keeping the job's checkpoint settings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from orchestrator.errors import RecordError
from orchestrator.outcome.states import JobState
from orchestrator.plan.build import build_plan
from orchestrator.plan.launch_plan import HeadContext, Placement
from orchestrator.plan.request import LaunchSpec
from orchestrator.records.checkpoints import (
    CheckpointEntry,
    CheckpointsRecord,
    FileCopy,
    NodeRestore,
    PartRecord,
    RestoreRecord,
    load_checkpoints,
    save_checkpoints,
)
from orchestrator.records.job import JobRecord
from orchestrator.records.rundir import RunDir
from orchestrator.run.plan_files import prepare_run
from orchestrator.specs.checkpoints import CheckpointSettings
from orchestrator.specs.inventory import make_hostfile

SHARDS = (
    PartRecord("n1", (FileCopy("global_step100/rank0.pt", 700, "a" * 64),
                      FileCopy("latest", 14, "b" * 64)), holders=("n2",)),
    PartRecord("n2", (FileCopy("global_step100/rank1.pt", 700, "c" * 64),), holders=("n3",)),
)  # fmt: skip
RECORD = CheckpointsRecord(
    dir="/data/ckpt", copies=1, bandwidth=200_000_000, shared=False,
    checkpoints=(
        CheckpointEntry("global_step100", "dir", 1000.0, 1030.5, "deepspeed latest", 1414,
                        SHARDS, None, 1),
        CheckpointEntry("global_step200", "dir", 2000.0, None, "", 700, SHARDS[:1], None, 1),
        CheckpointEntry("model.pt", "file", 500.0, 560.0, "quiet 60 s", 9, (), 900.0, 1),
    ),
    restores=(
        RestoreRecord(2, "global_step100", 2100.0, "the newest complete checkpoint",
                      skipped=("global_step200",),
                      nodes={"n3": NodeRestore(1414, 3, 0), "n2": NodeRestore(714, 2, 1)}),
        RestoreRecord(3, None, 3100.0, "no copy of any complete checkpoint survived"),
        RestoreRecord(4, "global_step100", 4100.0, "the newest complete checkpoint",
                      nodes={"n2": NodeRestore(0, 0, 3)}, failed={"n4": "n4: disk full"},
                      set_aside=("global_step200",)),
    ),
)  # fmt: skip


def test_a_record_is_read_back_as_it_was_written(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "job-1").create()
    save_checkpoints(run, RECORD)
    assert load_checkpoints(run) == RECORD
    assert CheckpointsRecord.from_dict(json.loads(json.dumps(RECORD.to_dict()))) == RECORD
    assert not (tmp_path / "job-1" / ".checkpoints.json.tmp").exists()  # replaced whole
    entry = RECORD.checkpoints[0]
    assert (entry.complete, entry.writers, entry.holders) == (True, ("n1", "n2"), ("n2", "n3"))
    assert RECORD.restores[0].received_bytes == 2128


def test_a_checkpoint_keeps_each_time_it_became_complete_after_its_writer_deletes_it():
    gone = CheckpointEntry("model.pt", "file", 500.0, None, "deleted", 9, (), 900.0, 1,
                           completions=(560.0, 700.0))  # fmt: skip
    assert not gone.complete and gone.became_complete == 700.0
    assert CheckpointEntry.from_dict(gone.to_dict()) == gone


def test_a_record_written_before_the_newer_fields_reads_as_it_did(tmp_path: Path) -> None:
    """completions, a restore's failed and set_aside came later: a record without them
    reads, completions taken from complete_at, the others empty."""
    data = json.loads(json.dumps(RECORD.to_dict()))
    for entry in data["checkpoints"]:
        del entry["completions"]
    for restore in data["restores"]:
        del restore["failed"], restore["set_aside"]
    old = CheckpointsRecord.from_dict(data)
    assert [e.completions for e in old.checkpoints] == [(1030.5,), (), (560.0,)]
    assert all(r.failed == {} and r.set_aside == () for r in old.restores)
    assert old.restores[1].sentence == (
        "attempt 3 starts from scratch: no copy of any complete checkpoint survived")


def test_the_restores_sentence_is_the_one_the_head_printed() -> None:
    assert RECORD.restores[2].sentence == (
        "attempt 4 resumes from global_step100, staged on 1 of 2 nodes (n2, 0 B sent); NOT on "
        "n4: n4: disk full; newer, not whole, moved to .orch-set-aside/ in the checkpoint "
        "directory: global_step200")
    assert RECORD.restores[0].nodes["n2"].words("n2") == (
        "n2: sent 714 B (2 files); 1 file already there")


def test_a_job_without_checkpoints_has_no_record(tmp_path: Path) -> None:
    assert load_checkpoints(RunDir(tmp_path / "job-1").create()) is None


@pytest.mark.parametrize(
    ("change", "said"),
    [(lambda d: d.pop("dir"), "'dir' is missing"),
     (lambda d: d.update(copies="1"), "'copies' is str"),
     (lambda d: d.update(shared="yes"), "'shared' is str"),
     (lambda d: d["checkpoints"][0].update(kind="link"), "kind 'link' is neither file nor dir"),
     (lambda d: d["checkpoints"][0].update(size=-1), "'size' is -1, below 0"),
     (lambda d: d["checkpoints"][0].update(attempt=True), "'attempt' is True"),
     (lambda d: d["checkpoints"][0]["parts"][0]["files"][0].pop("sha256"),
      "'sha256' is missing"),
     (lambda d: d["restores"][0].update(nodes=[]), "'nodes' is list"),
     (lambda d: d["restores"][0].update(skipped=[3]), "'skipped' holds 3, not a name"),
     (lambda d: d["restores"][2].update(failed={"n4": 1}), "a staging failure 1, not words"),
     (lambda d: d["checkpoints"][0].update(completions="x"), "'completions' is str"),
     (lambda d: d["checkpoints"][0].update(completions=[True]),
      "'completions' holds True, not a time"),
     (lambda d: d.update(checkpoints={}), "'checkpoints' is dict")],
)  # fmt: skip
def test_a_malformed_record_is_refused_naming_the_file(tmp_path: Path, change, said) -> None:
    run = RunDir(tmp_path / "job-1").create()
    data = json.loads(json.dumps(RECORD.to_dict()))
    change(data)
    (run.path / "checkpoints.json").write_text(json.dumps(data))
    with pytest.raises(RecordError) as refused:
        load_checkpoints(run)
    assert str(refused.value).startswith(f"{run.path / 'checkpoints.json'}: not a record of "
                                         "checkpoints orch can read (")  # fmt: skip
    assert said in str(refused.value)


def test_a_file_that_is_no_json_is_refused_naming_it(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "job-1").create()
    (run.path / "checkpoints.json").write_text('{"dir": "/c", "cop')
    with pytest.raises(RecordError, match=r"checkpoints\.json: not JSON"):
        load_checkpoints(run)


def test_job_json_keeps_the_jobs_checkpoint_settings(tmp_path: Path) -> None:
    spec = LaunchSpec("train.py", launcher="torchrun", workdir="/work/x",
                      checkpoints=CheckpointSettings("ckpt", copies=2, bandwidth=0))  # fmt: skip
    place = Placement(job_id="job-1", hostfile=make_hostfile(["n1", "n2"], 1),
                      run_dir=str(tmp_path / "job-1"), main_port=29511)  # fmt: skip
    plan = build_plan(spec, place, HeadContext("pdsh", str(tmp_path / "private"), sys.executable))
    run = RunDir(tmp_path / "job-1")
    prepare_run(plan, run)
    saved = json.loads((tmp_path / "job-1" / "job.json").read_text())
    assert saved["checkpoints"] == {"dir": "/work/x/ckpt", "copies": 2, "bandwidth": 0}
    assert run.load().checkpoints == CheckpointSettings("/work/x/ckpt", copies=2, bandwidth=0)
    plain = JobRecord(id="j", state=JobState.RUNNING, launcher="torchrun", command=(),
                      hosts=(), workdir="/", started_at="", head_pid=1, head_start=None)
    assert JobRecord.from_json(plain.to_json()).checkpoints is None
