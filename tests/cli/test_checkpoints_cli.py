"""`orch checkpoints JOB` on records written here: every checkpoint with its size, whether
and how it was found complete, its writers and holders, whether it was deleted, then what
each restart resumed from; the record as JSON; a job launched without --checkpoint-dir
refused with the fix."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from orchestrator.outcome.states import JobState
from orchestrator.records.checkpoints import (
    CheckpointEntry,
    CheckpointsRecord,
    FileCopy,
    NodeRestore,
    PartRecord,
    RestoreRecord,
    save_checkpoints,
)
from orchestrator.records.job import JobRecord
from orchestrator.records.rundir import RunDir
from orchestrator.specs.checkpoints import CheckpointSettings

_GIB = 2**30
STEP_100 = CheckpointEntry(
    name="global_step100", kind="dir", first_seen=1000.0, complete_at=1030.0,
    how="deepspeed latest", size=3 * _GIB,
    parts=(PartRecord("n1", (FileCopy("global_step100/rank0.pt", _GIB, "a" * 64),),
                      holders=("n3",)),
           PartRecord("n2", (FileCopy("global_step100/rank1.pt", 2 * _GIB, "b" * 64),),
                      holders=("n4",))),
    gone_at=None, attempt=1,
)  # fmt: skip
RECORD = CheckpointsRecord(
    dir="/data/ckpt", copies=1, bandwidth=200_000_000, shared=False,
    checkpoints=(
        replace(STEP_100, name="model-old.pt", kind="file", how="quiet 60 s", size=512,
                parts=(PartRecord("n1", (FileCopy("model-old.pt", 512, "c" * 64),),
                                  holders=("n2",)),), gone_at=1500.0),
        STEP_100,
        replace(STEP_100, name="global_step200", complete_at=None, how="", size=_GIB, parts=(
            PartRecord("n1", (FileCopy("global_step200/rank0.pt", _GIB, "d" * 64),)),)),
    ),
    restores=(RestoreRecord(2, "global_step100", 2100.0, "the newest complete checkpoint",
                            skipped=("global_step200",),
                            nodes={"n3": NodeRestore(2 * _GIB, 1, 1),
                                   "n4": NodeRestore(0, 0, 2)}),),
)  # fmt: skip


def _job(runs: Path, checkpoints: CheckpointSettings | None) -> RunDir:
    run = RunDir(runs / "job-1").create()
    run.save(JobRecord(id="job-1", state=JobState.SUCCEEDED, launcher="torchrun", command=("x",),
                       hosts=("n1", "n2"), workdir="/", started_at="2026-01-01T00:00:00+00:00",
                       head_pid=1, head_start="1", checkpoints=checkpoints))  # fmt: skip
    return run


def _row(stdout: str, name: str) -> list[str]:
    [line] = [line for line in stdout.splitlines() if f" {name} " in line]
    return [cell.strip() for cell in line.split("│")[1:-1]]


def test_every_checkpoint_and_every_restart_is_shown(tmp_path: Path, orch_here) -> None:
    runs = tmp_path / "runs"
    save_checkpoints(_job(runs, CheckpointSettings("/data/ckpt")), RECORD)
    result = orch_here(["checkpoints", "job-1"], runs)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    lines = out.splitlines()
    assert lines[:2] == [
        "checkpoints in /data/ckpt: 1 copy on another node, at most 200 MB/s",
        "each node has its own /data/ckpt: complete checkpoints are copied to other nodes",
    ]
    assert _row(out, "global_step100/") == ["global_step100/", "3.0 GiB", "yes (deepspeed latest)",
                                            "n[1-2]", "n[3-4]", "1", ""]  # fmt: skip
    assert _row(out, "global_step200/") == ["global_step200/", "1.0 GiB", "no", "n1", "-", "1", ""]
    assert _row(out, "model-old.pt") == ["model-old.pt", "512 B", "yes (quiet 60 s)", "n1", "n2",
                                         "1", "yes"]  # fmt: skip
    restarts = lines[lines.index("restarts:"):]
    assert restarts == [
        "restarts:",
        "attempt 2 resumes from global_step100, staged on 2 of 2 nodes (n[3-4], 2.0 GiB sent); "
        "skipped global_step200",
        "  n3: sent 2.0 GiB (1 file); 1 file already there",
        "  n4: sent 0 B (0 files); 2 files already there",
    ]
    # The same sentence the head printed before the attempt and the job's page shows.
    assert restarts[1] == RECORD.restores[0].sentence


def test_a_restart_with_nothing_to_resume_from_says_so(tmp_path: Path, orch_here) -> None:
    runs = tmp_path / "runs"
    nothing = RestoreRecord(3, None, 3100.0, "no copy of a complete checkpoint survived")
    save_checkpoints(_job(runs, CheckpointSettings("/data/ckpt")),
                     replace(RECORD, restores=(nothing,)))  # fmt: skip
    out = orch_here(["checkpoints", "job-1"], runs).stdout
    assert out.splitlines()[-1] == (
        "attempt 3 starts from scratch: no copy of a complete checkpoint survived"
    )


def test_a_shared_directory_says_nothing_was_copied(tmp_path: Path, orch_here) -> None:
    runs = tmp_path / "runs"
    shared = replace(RECORD, shared=True, restores=())
    save_checkpoints(_job(runs, CheckpointSettings("/data/ckpt")), shared)
    result = orch_here(["checkpoints", "job"], runs)  # a unique prefix of the id
    assert result.returncode == 0, result.stderr
    assert "every node sees /data/ckpt: nothing was copied" in result.stdout.splitlines()
    assert "restarts:" not in result.stdout


def test_json_is_the_record_alone(tmp_path: Path, orch_here) -> None:
    runs = tmp_path / "runs"
    save_checkpoints(_job(runs, CheckpointSettings("/data/ckpt")), RECORD)
    result = orch_here(["checkpoints", "job-1", "--json"], runs)
    assert result.returncode == 0, result.stderr
    assert CheckpointsRecord.from_dict(json.loads(result.stdout)) == RECORD


def test_a_job_with_nothing_seen_yet_shows_its_settings(tmp_path: Path, orch_here) -> None:
    runs = tmp_path / "runs"
    _job(runs, CheckpointSettings("/data/ckpt", copies=2, bandwidth=0))
    result = orch_here(["checkpoints", "job-1"], runs)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "checkpoints in /data/ckpt: 2 copies on other nodes, no bandwidth cap",
        "not found out yet whether every node sees /data/ckpt",
        "no checkpoint seen yet",
    ]


def test_a_job_launched_without_a_checkpoint_dir_is_refused_with_the_fix(
    tmp_path: Path, orch_here
) -> None:
    runs = tmp_path / "runs"
    _job(runs, None)
    result = orch_here(["checkpoints", "job-1"], runs)
    assert result.returncode == 2
    text = " ".join(result.stderr.split())
    assert "error: job job-1 was not launched with --checkpoint-dir" in text
    assert "hint: launch with --checkpoint-dir PATH" in text


def test_a_malformed_record_is_refused_naming_the_file(tmp_path: Path, orch_here) -> None:
    runs = tmp_path / "runs"
    run = _job(runs, CheckpointSettings("/data/ckpt"))
    (run.path / "checkpoints.json").write_text('{"dir": "/data/ckpt"}')
    result = orch_here(["checkpoints", "job-1"], runs)
    assert result.returncode == 73
    assert f"{run.path}/checkpoints.json: not a record of checkpoints orch can read" in \
        " ".join(result.stderr.split())
