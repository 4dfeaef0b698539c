"""`--push-env` on values: which nodes the pre-flight's report sends the head's environment to,
what the job's record keeps of every node's environment, and the option's usage errors."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from _doctor_facts import PY, facts

from orchestrator.checks.model import DoctorReport, NodeError, NodeProbe
from orchestrator.checks.report import build_report
from orchestrator.checks.request import PreflightRequest
from orchestrator.plan.request import JobRequest, WatchRequest, check_push_env, recipe_spec
from orchestrator.prepare.push_env import (
    PushDone,
    environment_record,
    node_fingerprints,
    nodes_to_push,
    push_fix,
)
from orchestrator.probe.facts import Environment
from orchestrator.records.attempt_facts import attempt_record
from orchestrator.records.job import EnvironmentRecord, JobRecord, process_start_time
from orchestrator.records.rundir import RunDir
from orchestrator.specs.inventory import parse_hostfile
from orchestrator.specs.recipe import parse_recipe

HOSTS = parse_hostfile("n1 slots=2\nn2 slots=2\nn3 slots=2\n")


def env(fingerprint: str, **dists: str) -> Environment:
    return Environment(fingerprint, "cpython", "3.11.7", "cpython-311-x86_64-linux-gnu",
                       "debian 12", "glibc 2.36", "x86_64",
                       {"torch": "2.13.0", **dists})  # fmt: skip


def report(head: Environment | None, *probes: NodeProbe) -> DoctorReport:
    request = PreflightRequest(HOSTS, python=PY, workdir="/work", env={})
    return build_report(request, probes, head_environment=head)


def probe(node: str, environment: Environment | None = None, **changes: object) -> NodeProbe:
    return NodeProbe(node, facts(node, environment=environment, **changes))


HEAD = env("aaaa")
OLD = env("bbbb", numpy="1.26.4")


def test_the_nodes_whose_environment_is_not_the_heads_are_pushed_to() -> None:
    gone = NodeProbe("n3", None, NodeError("unreachable", "n3: no route", "check it"))
    found = report(HEAD, probe("n1", HEAD), probe("n2", OLD), gone)
    assert nodes_to_push(found) == ("n2",)  # n3 gave no facts: nothing to push it to
    missing = report(HEAD, probe("n1", None, python_found=False), probe("n2", HEAD),
                     probe("n3", OLD))  # fmt: skip
    assert nodes_to_push(missing) == ("n1", "n3")  # no environment at the path: pushed too
    assert nodes_to_push(report(HEAD, probe("n1", HEAD), probe("n2", HEAD))) == ()
    nowhere = report(HEAD, *(probe(n, None, python_found=False) for n in ("n1", "n2", "n3")))
    assert nowhere.environment is None  # nothing to compare, and still every node to push to
    assert nodes_to_push(nowhere) == ("n1", "n2", "n3")


def test_nothing_is_pushed_where_the_head_is_not_the_reference() -> None:
    # the head has not the job's interpreter: node 0 is the reference, not a push's source
    found = report(None, probe("n1", HEAD), probe("n2", OLD))
    assert found.environment is not None and found.environment.reference == "n1"
    assert nodes_to_push(found) == ()


def test_the_record_keeps_every_nodes_fingerprint_and_the_push() -> None:
    gone = NodeProbe("n3", None, NodeError("unreachable", "n3: no route", "check it"))
    found = report(HEAD, probe("n1", HEAD), probe("n2", None, python_found=False), gone)
    assert node_fingerprints(found) == {"n1": "aaaa", "n2": None, "n3": None}
    kept = environment_record(found)
    assert kept == EnvironmentRecord("aaaa", {"n1": "aaaa", "n2": None, "n3": None})
    done = PushDone("/opt/venv", "aaaa", ("n2",), 1234, 1.5)
    after = environment_record(report(HEAD, probe("n1", HEAD), probe("n2", HEAD)), done)
    assert after.to_json() == {"reference": "aaaa", "nodes": {"n1": "aaaa", "n2": "aaaa"},
                               "pushed": ["n2"], "pushed_bytes": 1234}  # fmt: skip
    unknown = environment_record(report(None, probe("n1", HEAD), probe("n2", OLD)))
    assert unknown.reference is None and unknown.nodes == {"n1": "aaaa", "n2": "bbbb"}


def _record(**changes: object) -> JobRecord:
    base = JobRecord(id="j1", state="running", launcher="torchrun", command=("python", "x.py"),
                     hosts=("n1", "n2"), workdir="/w", started_at="2026-01-01T00:00:00+00:00",
                     head_pid=os.getpid(), head_start=process_start_time(os.getpid()))  # fmt: skip
    return replace(base, **changes)


def test_job_json_holds_the_environments_and_null_when_no_pre_flight_looked(
    tmp_path: Path,
) -> None:
    kept = EnvironmentRecord("aaaa", {"n1": "aaaa", "n2": "aaaa"}, ("n2",), 99)
    run = RunDir(tmp_path / "j1").create()
    run.save(_record(environment=kept))
    doc = json.loads(run.job_file.read_text())
    assert doc["environment"] == {"reference": "aaaa", "nodes": {"n1": "aaaa", "n2": "aaaa"},
                                  "pushed": ["n2"], "pushed_bytes": 99}  # fmt: skip
    assert run.load().environment == kept
    run.save(_record())
    assert json.loads(run.job_file.read_text())["environment"] is None
    assert run.load().environment is None


def test_each_attempt_keeps_its_nodes_environments(tmp_path: Path) -> None:
    first = EnvironmentRecord("aaaa", {"n1": "aaaa", "n2": "aaaa"})
    attempt = attempt_record(_record(state="failed", exit_code=1, environment=first), None)
    assert attempt.environment == first
    second = EnvironmentRecord("aaaa", {"n1": "aaaa", "n3": "aaaa"}, ("n3",), 5)
    run = RunDir(tmp_path / "j1").create()
    run.save(_record(attempts=(attempt,), attempt=2, environment=second))
    doc = json.loads(run.job_file.read_text())
    assert doc["attempts"][0]["environment"]["nodes"] == {"n1": "aaaa", "n2": "aaaa"}
    assert doc["environment"]["pushed"] == ["n3"]
    loaded = run.load()
    assert loaded.attempts[0].environment == first and loaded.environment == second
    old = {k: v for k, v in doc["attempts"][0].items() if k != "environment"}  # older records
    assert type(attempt).from_json(old).environment is None


def test_push_env_needs_the_pre_flight_and_the_recipe_may_ask_for_it() -> None:
    recipe = parse_recipe("name: r\nscript: t.py\npush_env: true\n")
    assert recipe.push_env is True
    asked = JobRequest(spec=recipe_spec(recipe, "r.yaml"), recipe=recipe)
    assert asked.push_env
    check_push_env(asked)
    from orchestrator.errors import UsageError

    with pytest.raises(UsageError, match="the recipe's push_env: true needs the pre-flight"):
        check_push_env(replace(asked, watch=WatchRequest(preflight=False)))
    given = JobRequest(spec=recipe_spec(recipe, "r.yaml"),
                       watch=WatchRequest(preflight=False, push_env=True))  # fmt: skip
    with pytest.raises(UsageError, match="--push-env needs the pre-flight"):
        check_push_env(given)


def test_the_fix_pushes_only_an_environment(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys._base_executable)
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys._base_executable).parent}\n")
    python = str(venv / "bin" / "python")
    fix = push_fix(python, hostfile="hf", option=True)
    assert fix is not None and fix.command == f"orch env push --hostfile hf --python {python}"
    assert fix.option
    assert push_fix(python, option=True) == replace(fix, command=None)  # nodes from no file
    assert push_fix(sys._base_executable, hostfile="hf") is None  # a system interpreter


def test_launch_refuses_push_env_without_the_pre_flight_or_an_environment(
    tmp_path: Path, orch_here
) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a1 slots=2\na2 slots=2\n")
    base = ["launch", "--hostfile", str(hostfile), "--push-env"]
    skipped = orch_here([*base, "--no-doctor", "train.py"], tmp_path / "runs")
    assert skipped.returncode == 2 and "--push-env needs the pre-flight" in skipped.stderr
    system = orch_here([*base, "--python", sys._base_executable, "--dry-run", "train.py"],
                       tmp_path / "runs")  # fmt: skip
    assert system.returncode == 2
    assert "is not in a virtual or conda environment" in system.stderr


def test_status_says_in_one_line_what_the_nodes_ran() -> None:
    from orchestrator.cli.jobs.record_shown import environment_line

    same = EnvironmentRecord("aaaa1111bbbb", {"n1": "aaaa1111bbbb", "n2": "aaaa1111bbbb"},
                             ("n2",), 3 << 20)  # fmt: skip
    assert environment_line(same) == (
        "environment: aaaa1111 on every node, the head's; pushed to n2 (3.0 MiB)"
    )
    mixed = EnvironmentRecord("aaaa1111bbbb", {"n1": "aaaa1111bbbb", "n2": "cccc2222", "n3": None})
    assert environment_line(mixed) == (
        "environment: aaaa1111 on n1, cccc2222 on n2, unknown on n3, the head's is aaaa1111"
    )
    assert environment_line(None) == "environment: not looked at (no pre-flight)"
