"""Every `--json` document, and job.json, says what it is and in which version: `schema`
(`orch.<what>`) and `schema_version` come first, for a program that reads them."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.records.job import JobRecord
from orchestrator.records.rundir import RunDir
from orchestrator.specs.constants import SCHEMA_VERSION

JOB = "20261124-010203-aaaaaa"


def _first_two(text: str) -> list[tuple[str, object]]:
    return list(json.loads(text).items())[:2]


def _runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    record = JobRecord(id=JOB, state="succeeded", launcher="pdsh", command=("x.py",),  # type: ignore[arg-type]
                       hosts=("a",), workdir="/w", started_at="2026-11-24T01:02:03+00:00",
                       head_pid=0, head_start=None)  # fmt: skip
    RunDir(runs / JOB).create().save(record)
    return runs


def test_job_json_names_its_schema_and_reads_back(tmp_path):
    runs = _runs(tmp_path)
    text = (runs / JOB / "job.json").read_text()
    assert _first_two(text) == [("schema", "orch.job"), ("schema_version", SCHEMA_VERSION)]
    assert RunDir(runs / JOB).load().id == JOB


def test_every_json_document_of_a_job_names_its_schema(tmp_path, orch_here):
    runs = _runs(tmp_path)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a1 slots=2\n")
    for args, what in ((["status", "--json"], "orch.jobs"),
                       (["status", JOB, "--json"], "orch.job"),
                       (["launch", "-H", str(hostfile), "--dry-run", "--json", "t.py"],
                        "orch.plan")):  # fmt: skip
        result = orch_here(args, runs)
        assert result.returncode == 0, result.stderr
        assert _first_two(result.stdout) == [("schema", what), ("schema_version", SCHEMA_VERSION)]
    listed = json.loads(orch_here(["status", "--json"], runs).stdout)
    assert listed["jobs"][0]["schema"] == "orch.job"  # each record as job.json has it
