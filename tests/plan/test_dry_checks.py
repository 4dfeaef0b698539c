"""What a dry run finds on the head, on values: the script, the runs directory, the exit
code the real launch would stop with; and the readable plan's settings, marks and commands."""

from __future__ import annotations

import sys

from orchestrator.plan.build import build_plan
from orchestrator.plan.describe import (
    LONG_COMMAND,
    accelerate_settings,
    command_files,
    dry_run_document,
    plan_text,
)
from orchestrator.plan.dry_checks import (
    RUNS_DIR_FIX,
    DryFinding,
    HeadFacts,
    RunsDirFacts,
    dry_run_exit_code,
    dry_run_findings,
)
from orchestrator.plan.launch_plan import HeadContext, Placement
from orchestrator.plan.request import LaunchSpec
from orchestrator.specs.inventory import make_hostfile
from orchestrator.specs.recipe import AccelerateOptions, DynamoOptions

PLACE = Placement(job_id="job-1", hostfile=make_hostfile(["n1", "n2"], 2),
                  run_dir="/runs/job-1", main_port=29511)  # fmt: skip
HEAD = HeadContext("/usr/bin/pdsh", "/tmp/orch-job-1", sys.executable)
RUNS_OK = RunsDirFacts("/runs", "/runs", writable=True)


def _plan(launcher: str = "pdsh", **spec):
    values = dict(script="train.py", launcher=launcher, python="/py", workdir="/w")
    return build_plan(LaunchSpec(**{**values, **spec}), PLACE, HEAD)


def test_a_script_missing_on_the_head_is_a_warning_naming_the_path_and_the_fix() -> None:
    facts = HeadFacts("/w/train.py", script_exists=False, runs=RUNS_OK)
    [finding] = dry_run_findings(_plan(), facts)
    assert finding == DryFinding(
        "script",
        "training script train.py does not exist on this machine (/w/train.py)",
        "check the path (a relative one is taken in the working directory /w, --workdir or "
        "the recipe's workdir); if only the nodes have it, `orch doctor --hostfile F --script "
        "train.py` looks there",
    )
    assert not finding.is_error and dry_run_exit_code((finding,)) == 0


def test_a_runs_directory_the_launch_cannot_use_is_an_error_with_the_launchs_code() -> None:
    others = RunsDirFacts("/runs", "/runs", writable=True,
                          not_own="/runs (owner bob, mode 0755) belongs to another user",
                          not_own_fix="use a runs directory that is yours")  # fmt: skip
    locked = RunsDirFacts("/runs", "/runs", writable=False)
    unmade = RunsDirFacts("/srv/x/runs", "/srv", writable=False)
    found = {}
    for name, runs in (("others", others), ("locked", locked), ("unmade", unmade)):
        facts = HeadFacts("/w/train.py", script_exists=False, runs=runs)
        findings = dry_run_findings(_plan(), facts)
        assert [f.subject for f in findings] == ["runs directory", "script"]  # errors first
        assert dry_run_exit_code(findings) == 73  # what the real launch exits with
        found[name] = findings[0]
    assert found["others"].problem.endswith("belongs to another user")
    assert found["others"].fix == "use a runs directory that is yours"
    assert found["locked"].problem == ("runs directory /runs is not writable by you: the job's "
                                       "record cannot be made there")  # fmt: skip
    assert found["unmade"].problem == (
        "runs directory /srv/x/runs does not exist, and /srv (where it would be made) is not "
        "writable by you"
    )
    assert found["locked"].fix == RUNS_DIR_FIX == (
        "use a runs directory of your own: --runs-dir DIR or ORCH_RUNS_DIR=DIR"
    )


def test_nothing_to_say_when_the_head_has_both() -> None:
    facts = HeadFacts("/w/train.py", script_exists=True, runs=RunsDirFacts("/r", "/", True))
    assert dry_run_findings(_plan(), facts) == () and dry_run_exit_code(()) == 0
    document = dry_run_document(_plan(), (DryFinding("script", "p", "f"),))
    assert document["findings"] == [{"level": "warning", "subject": "script", "problem": "p",
                                     "fix": "f", "exit_code": 0}]  # fmt: skip


def test_the_accelerate_settings_in_one_line() -> None:
    zero3 = AccelerateOptions(zero_stage=3, mixed_precision="fp16", zero3_init_flag=True,
                              gradient_clipping=1.0)  # fmt: skip
    assert accelerate_settings(zero3) == (
        "DeepSpeed ZeRO stage 3, zero3_init_flag, mixed precision fp16, gradient accumulation "
        "1, gradient clipping 1"
    )
    offload = AccelerateOptions(offload_optimizer_device="cpu", mixed_precision="bf16",
                                dynamo=DynamoOptions(backend="inductor"))  # fmt: skip
    assert accelerate_settings(offload) == (
        "DeepSpeed ZeRO stage 2, optimizer offloaded to cpu, mixed precision bf16, gradient "
        "accumulation 1, dynamo INDUCTOR (default)"
    )
    ddp = AccelerateOptions(distributed_type="MULTI_GPU")
    assert accelerate_settings(ddp).startswith("MULTI_GPU (DDP, no DeepSpeed), mixed precision no")


def test_the_readable_plan_shows_the_settings_and_marks_what_it_does_not_write() -> None:
    text = plan_text(_plan(accelerate=AccelerateOptions(zero_stage=3, mixed_precision="bf16")))
    lines = text.splitlines()
    assert lines[1] == ("accelerate: DeepSpeed ZeRO stage 3, mixed precision bf16, gradient "
                        "accumulation 1")  # fmt: skip
    assert "record: /runs/job-1 (not written)" in lines
    assert "  /runs/job-1/hostfile (not written)" in lines
    assert "accelerate:" not in plan_text(_plan("torchrun"))  # torchrun has no such settings


def test_every_command_is_printed_whole_or_written_whole() -> None:
    for launcher in ("pdsh", "standard", "torchrun"):
        plan = _plan(launcher)
        text = plan_text(plan, "/dry")
        assert "..." not in text  # nothing elided
        written = {f.name: f.text for f in command_files(plan)}
        assert "teardown.sh" in written  # the node program inline: 5 KiB
        assert "  sh /dry/teardown.sh   (the command in full, " in text
        for line in text.splitlines():
            assert len(line) <= LONG_COMMAND + 200 or line.startswith("every node's agent")
        last = written["teardown.sh"].splitlines()[-1]
        assert last.startswith("/usr/bin/pdsh -R ssh -w n1,n2 ") and "job-1 5 %h" in last
