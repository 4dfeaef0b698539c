"""`orch launch/submit --dry-run`, usage errors and `orch status` without running a job."""

from __future__ import annotations

import json
from pathlib import Path

from launch_support import REPO

from orchestrator.plan.ports import port_candidates
from orchestrator.run.plan_files import head_private_dir


def _hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("a1 slots=2\na2 slots=2\n")
    return str(path)


def test_launch_dry_run_prints_the_plan_as_json_with_secrets_redacted(tmp_path, orch_here):
    result = orch_here(["launch", "--hostfile", _hostfile(tmp_path), "--launcher", "torchrun",
                       "--env", "HF_TOKEN=hunter2", "--dry-run", "--json",
                       "train.py", "--", "--lr", "1"], tmp_path / "runs")  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["launcher"] == "torchrun" and plan["world_size"] == 4
    # The launcher starts orch-rank; the rank's own command is exactly what was typed.
    assert plan["node_command"][-2:] == ["--no-python", "orch-rank"]
    assert plan["rank_command"][1:] == ["train.py", "--lr", "1"]
    assert plan["env"]["HF_TOKEN"] == "***"
    assert "hunter2" not in result.stdout
    assert not (tmp_path / "runs").exists()  # nothing written, nothing run


def test_submit_dry_run_resolves_the_recipe(tmp_path, orch_here):
    recipe = str(REPO / "recipes" / "cpu-smoke.yaml")
    result = orch_here(["submit", recipe, "--hostfile", _hostfile(tmp_path), "--dry-run", "--json"],
                      tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["launcher"] == "pdsh"
    assert plan["script"].endswith("recipes/scripts/cpu_smoke.py")
    assert "deepspeed_multinode_launcher: pdsh" in plan["files"]["accelerate-pdsh.yaml"]


def test_usage_errors_exit_2_and_say_how_to_fix(tmp_path, orch_here):
    unknown = orch_here(["launch", "--hostfile", _hostfile(tmp_path), "--launcher", "slurm",
                        "train.py"], tmp_path)  # fmt: skip
    assert unknown.returncode == 2 and "unknown launcher 'slurm'" in unknown.stderr
    missing = orch_here(["launch", "--hostfile", str(tmp_path / "nope"), "train.py"], tmp_path)
    assert missing.returncode == 2 and "nope" in missing.stderr
    no_hostfile = orch_here(["launch", "train.py"], tmp_path)
    assert no_hostfile.returncode == 2 and "--hostfile" in no_hostfile.stderr


def test_status_with_no_jobs(tmp_path, orch_here):
    listing = orch_here(["status", "--json"], tmp_path)
    assert listing.returncode == 0
    assert json.loads(listing.stdout)["jobs"] == []
    one = orch_here(["status", "nope"], tmp_path)
    assert one.returncode == 2 and "no jobs recorded" in one.stderr


def test_dry_run_prints_the_pdsh_command_and_every_node_command_and_writes_nothing(
    tmp_path, orch_here
):
    hostfile = str(REPO / "hostfiles" / "example-2x8")
    result = orch_here(["launch", "--hostfile", hostfile, "--dry-run", "--", "train.py", "--lr",
                       "it's 1"], tmp_path / "runs")  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    job_id = lines[0].split()[1].rstrip(":")
    port = port_candidates(job_id)[0]  # no port given: the first one orch would try
    assert 29500 <= port <= 30499
    assert lines[0].endswith(f"pdsh launcher, 2 nodes x 8 ranks = 16 ranks, main node1:{port}")
    assert lines[1].startswith("  (main port picked by orch: free on node 0 and reserved")
    assert any(" -S -f 1024 -w node1,node2`" in line for line in lines)
    for rank, node in enumerate(("node1", "node2")):
        line = next(line for line in lines if line.startswith(f"  {node} (node rank {rank}): "))
        assert f"--node_rank={rank} --master_addr=node1 --master_port={port}" in line
        assert line.endswith("--no_python --no_local_rank orch-rank")
    at = lines.index("and the launcher starts every rank through orch-rank, which runs exactly:")
    assert lines[at + 1].endswith(" train.py --lr 'it'\"'\"'s 1'")
    assert not (tmp_path / "runs").exists()
    assert not Path(head_private_dir(job_id)).exists()


def test_a_given_main_port_is_used_as_given(tmp_path, orch_here):
    hostfile = str(REPO / "hostfiles" / "example-2x8")
    result = orch_here(["launch", "--hostfile", hostfile, "--main-port", "29500", "--dry-run",
                       "--json", "train.py"], tmp_path / "runs")  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert (plan["main"], plan["main_port_chosen"]) == ("node1:29500", False)


def test_two_jobs_try_different_ports_first(orch_here):
    firsts = {port_candidates(f"20261123-0000{i:02d}-abcdef")[0] for i in range(50)}
    assert len(firsts) > 40  # spread over the range, not all at the default
    assert all(29500 <= port <= 30499 for port in firsts)
    assert len(set(port_candidates("j1"))) == 64


def test_an_unknown_option_before_the_script_is_a_usage_error_and_after_it_the_scripts(
    tmp_path, orch_here
):
    hostfile = _hostfile(tmp_path)
    typo = orch_here(["launch", "--hostfile", hostfile, "--dry-rn", "train.py"], tmp_path / "runs")
    assert typo.returncode == 2
    assert "No such option: --dry-rn" in typo.stderr and "--dry-run" in typo.stderr
    assert not (tmp_path / "runs").exists()
    after = orch_here(["launch", "--hostfile", hostfile, "--launcher", "torchrun", "--dry-run",
                      "--json", "train.py", "--lr", "1", "--dry-run"], tmp_path)  # fmt: skip
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["args"] == ["--lr", "1", "--dry-run"]


def test_uneven_slots_are_refused_before_anything_starts_unless_the_count_is_given(
    tmp_path, orch_here
):
    path = tmp_path / "uneven"
    path.write_text("a1 slots=2\na2 slots=1\na3 slots=2\n")
    refused = orch_here(["launch", "--hostfile", str(path), "train.py"], tmp_path / "runs")
    assert refused.returncode == 2
    assert "different slot counts (a1=2, a2=1, a3=2)" in refused.stderr
    assert not (tmp_path / "runs").exists()
    assert "--launcher torchrun runs each node's own count (5 ranks in all)" in refused.stderr
    standard = orch_here(["launch", "--hostfile", str(path), "--launcher", "standard",
                         "train.py"], tmp_path / "runs")  # fmt: skip
    assert standard.returncode == 2 and "the standard launcher starts the same" in standard.stderr
    given = orch_here(["launch", "--hostfile", str(path), "--nproc-per-node", "1", "--dry-run",
                      "--json", "train.py"], tmp_path)  # fmt: skip
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)["world_size"] == 3


def test_uneven_slots_run_as_they_are_on_torchrun(tmp_path, orch_here):
    path = tmp_path / "uneven"
    path.write_text("a1 slots=2\na2 slots=1\na3 slots=2\n")
    args = ["launch", "--hostfile", str(path), "--launcher", "torchrun", "--dry-run"]
    plan = json.loads(orch_here([*args, "--json", "train.py"], tmp_path).stdout)
    assert (plan["world_size"], plan["ranks_per_node"]) == (5, [2, 1, 2])
    counts = [f"--nproc_per_node={n}" for n in (2, 1, 2)]
    # What each node's agent runs, and what the plan shows for it: each node its own count.
    assert [c for argv in plan["agent_spec"]["commands"] for c in argv if "nproc" in c] == counts
    assert all(c in node["runs"] for c, node in zip(counts, plan["nodes"], strict=True))
    text = orch_here([*args, "train.py"], tmp_path).stdout
    assert "torchrun launcher, 3 nodes (2+1+2 ranks) = 5 ranks" in text


def test_include_and_exclude_select_nodes_and_name_an_unknown_one(tmp_path, orch_here):
    hostfile = _hostfile(tmp_path)
    for option, expected in (("--exclude", ["a1"]), ("--include", ["a2"])):
        result = orch_here(["launch", "--hostfile", hostfile, option, "a2" if option ==
                           "--exclude" else "a[2]", "--dry-run", "--json", "train.py"],
                          tmp_path)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert [h["host"] for h in json.loads(result.stdout)["hosts"]] == expected
    unknown = orch_here(["launch", "--hostfile", hostfile, "--exclude", "a9", "train.py"], tmp_path)
    assert unknown.returncode == 2 and "host 'a9' is not in" in unknown.stderr


def test_launch_and_submit_take_the_one_option_set_and_hand_it_on_as_one_value(orch_here):
    from dataclasses import fields

    from orchestrator.cli.about.reference import root_command
    from orchestrator.cli.jobs.job_options import JobOptions

    group = root_command()
    shared = {f.name for f in fields(JobOptions)}
    for name in ("launch", "submit"):
        params = {p.name for p in group.commands[name].params}  # type: ignore[attr-defined]
        assert shared <= params and "options" not in params
