"""A request made concrete on the head: its nodes, pool and plan (a dry run asks no node),
the same job on other nodes for a later attempt, and the options it runs with."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from orchestrator.plan.request import (
    HostsRequest,
    JobRequest,
    WatchRequest,
    launch_spec,
    recipe_spec,
)
from orchestrator.prepare.job import pipeline_options, prepare_job, push_hosts
from orchestrator.specs.constants import RESTART_COUNT_VAR
from orchestrator.specs.recipe import parse_recipe


def _request(tmp_path: Path, **changes: object) -> JobRequest:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=2\nn2 slots=2\nn3 slots=2\n")
    spec = launch_spec("train.py", [], launcher="torchrun", env=[], environ={})
    request = JobRequest(spec=spec, hosts=HostsRequest(hostfile=str(hostfile), nodes=2),
                         runs_dir=str(tmp_path / "runs"), job_id="j1")  # fmt: skip
    return replace(request, **changes)  # type: ignore[arg-type]


def test_a_dry_run_plans_the_first_nodes_with_the_private_directory_it_is_given(tmp_path):
    job = prepare_job(_request(tmp_path), {}, private_dir=lambda job_id: f"/private/{job_id}",
                      dry_run=True)  # fmt: skip
    assert (job.plan.job_id, job.plan.job.private_dir) == ("j1", "/private/j1")
    assert tuple(job.plan.hosts) == ("n1", "n2")
    assert job.pool is not None and tuple(job.pool.names) == ("n1", "n2", "n3")  # n3: a spare
    later = job.on(["n1", "n3"], 1)
    assert (later.plan.job_id, tuple(later.plan.hosts)) == ("j1", ("n1", "n3"))
    assert later.plan.job.env[RESTART_COUNT_VAR] == "1"


def test_env_push_finds_the_jobs_nodes_where_the_job_did(tmp_path):
    recipe = parse_recipe("name: r\nscript: t.py\nhostfile: /r/hosts\n")
    request = _request(tmp_path, recipe=recipe)
    assert push_hosts(request) == request.hosts  # --hostfile first
    own = JobRequest(spec=request.spec, recipe=recipe)
    assert push_hosts(own).hostfile == "/r/hosts"
    allocation = JobRequest(spec=request.spec, recipe=recipe, hosts=HostsRequest(slurm=True))
    assert push_hosts(allocation).hostfile is None


def test_the_options_take_the_watch_requests_and_the_default_heartbeat(tmp_path):
    request = _request(tmp_path, watch=WatchRequest(preflight=False, sync=True))
    options = pipeline_options(request)
    assert (options.preflight, options.sync, options.push_env) == (False, True, False)
    assert options.settings.heartbeat_timeout == type(options.settings).heartbeat_timeout
    quick = pipeline_options(_request(tmp_path, watch=WatchRequest(heartbeat_timeout=3.0)))
    assert quick.settings.heartbeat_timeout == 3.0


def test_a_job_is_named_by_the_user_else_its_recipe_else_its_script(tmp_path):
    job = prepare_job(_request(tmp_path), {}, private_dir=lambda j: f"/p/{j}", dry_run=True)
    assert job.plan.name == "train"  # train.py
    recipe = parse_recipe("name: bert-base\nscript: /r/train.py\n")
    assert recipe_spec(recipe, "/r/bert.yaml").name == "bert-base"
    named = _request(tmp_path, spec=replace(_request(tmp_path).spec, name="ablation-3"))
    job = prepare_job(named, {}, private_dir=lambda j: f"/p/{j}", dry_run=True)
    assert job.plan.name == "ablation-3"
