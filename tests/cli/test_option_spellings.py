"""One meaning per option spelling across every command: short flags, node sets (-w) and
counts (-N), the spellings of torchrun, accelerate and DeepSpeed accepted as hidden aliases,
the old spellings refused with the one that means it now (exit 2), the launchers by their
tools' names, and `--json` only with `--dry-run`."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from launch_support import REPO

from orchestrator.cli.about.reference import commands, root_command
from orchestrator.cli.app import OrchCommand
from orchestrator.errors import UsageError
from orchestrator.specs.spellings import ALIASES, aliases_of, own_spellings, refusals_for


def _options(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option"]


def _long(param: Any) -> str:
    return next(name for name in param.opts if name.startswith("--"))


def test_each_short_flag_has_one_long_meaning_in_every_command() -> None:
    meanings: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, command in commands(root_command()):
        for param in _options(command):
            for short in (o for o in (*param.opts, *param.secondary_opts) if len(o) == 2):
                meanings[short][_long(param)].append(name)
    assert {"-H", "-w", "-N", "-i", "-e", "-o", "-l", "-r"} <= set(meanings)
    several = {short: dict(longs) for short, longs in meanings.items() if len(longs) > 1}
    assert several == {}, f"a short flag means several options: {several}"


def test_node_sets_are_dash_w_and_counts_dash_n_wherever_a_command_takes_them() -> None:
    for name, command in commands(root_command()):
        for param in _options(command):
            if "--nodelist" in param.opts:
                assert "-w" in param.opts, name
            if "--nodes" in param.opts:
                assert "-N" in param.opts and param.metavar == "N", name
            assert "-n" not in param.opts, f"{name}: -n meant three things; it means none"


def test_every_command_parses_orchs_spellings_and_none_shadows_an_option() -> None:
    everything = set()
    for name, command in commands(root_command()):
        if hasattr(command, "list_commands"):
            continue
        assert isinstance(command, OrchCommand), name
        has = own_spellings(command.params)
        everything |= has
        aliases = {alias for param in _options(command) for alias in aliases_of(param)}
        refused = set(refusals_for(has))
        assert not (aliases & has) and not (refused & has) and not (aliases & refused), name
    assert set(ALIASES.values()) <= everything  # every alias names an option orch has


def _command(path: str) -> Any:
    command = root_command()
    for word in path.split()[1:]:
        command = command.get_command(command.context_class(command, info_name="orch"), word)
    return command


def _parsed(path: str, *args: str) -> dict[str, Any]:
    """What `path args` parses into, without running it."""
    return _command(path).make_context(path, list(args)).params


@pytest.mark.parametrize(
    ("path", "args", "param", "value"),
    [
        ("orch launch", ["--nproc_per_node", "2"], "nproc_per_node", 2),
        ("orch launch", ["--num_gpus=2"], "nproc_per_node", 2),
        ("orch launch", ["--master_port", "29600"], "main_port", 29600),
        ("orch launch", ["--master-port=29600"], "main_port", 29600),
        ("orch submit", ["--main_process_port", "29600"], "main_port", 29600),
        ("orch launch", ["--nnodes", "2"], "nodes", 2),
        ("orch submit", ["--num_nodes", "2"], "nodes", 2),
        ("orch launch", ["--num_machines", "2"], "nodes", 2),
        ("orch doctor", ["--master_addr", "10.0.0.1"], "main_address", "10.0.0.1"),
        ("orch config", ["--main-ip", "10.0.0.1"], "main_address", "10.0.0.1"),
        ("orch config", ["--main_process_ip", "10.0.0.1"], "main_address", "10.0.0.1"),
        ("orch config", ["--num_processes", "8"], "num_processes", 8),
        ("orch config", ["--out-dir", "d"], "out_dir", Path("d")),
        ("orch logs", ["--node", "n1", "--node", "n2"], "node", ["n1", "n2"]),
        ("orch sandbox up", ["-N", "3"], "nodes", 3),
    ],
)
def test_the_other_tools_spellings_are_hidden_aliases(path, args, param, value) -> None:
    script = ["J"] if path == "orch logs" else ["t.py"] if path == "orch launch" else []
    recipe = ["r.yaml"] if path == "orch submit" else []
    assert _parsed(path, *recipe, *args, *script)[param] == value


@pytest.mark.parametrize(
    ("path", "args", "said", "hint"),
    [
        ("orch hostfile", ["--nodes", "gpu[01-04]"], "--nodes is a count of nodes",
         "did you mean -w 'gpu[01-04]'?"),
        ("orch config", ["--nodes", "4", "--slots", "8"], "takes the nodes by name",
         "-w 'gpu[01-04]'"),
        ("orch config", ["-n", "a,b"], "-n is no option here", "did you mean -w a,b?"),
        ("orch hostfile", ["-w", "4"], "4 is a count", "name the nodes"),
        ("orch launch", ["-w", "4", "t.py"], "4 is a count", "did you mean -N 4?"),
        ("orch launch", ["--nodes", "gpu[01-04]", "t.py"], "not a node set",
         "did you mean -w 'gpu[01-04]'?"),
        ("orch launch", ["-n", "4", "t.py"], "-n is not an option of orch launch",
         "did you mean -N 4?"),
        ("orch sandbox up", ["-n", "4"], "a count of nodes is -N/--nodes", "did you mean -N 4?"),
        ("orch sandbox up", ["-N", "node[1-4]"], "a count of nodes", None),
        ("orch config", ["-r", "x.yaml"], "-r is --rank", "did you mean --recipe x.yaml?"),
        ("orch launch", ["-e", "NCCL_DEBUG=INFO", "t.py"], "-e is --exclude",
         "--env NCCL_DEBUG=INFO"),
        ("orch launch", ["-e", "HF_TOKEN", "t.py"], "-e is --exclude", "--env HF_TOKEN"),
        ("orch launch", ["--num_processes", "16", "t.py"], "accelerate's total",
         "--nproc-per-node N"),
        ("orch submit", ["r.yaml", "--num-processes", "16"], "accelerate's total",
         "--nproc-per-node N"),
        ("orch launch", ["--master_addr", "n1", "t.py"], "the main node is node 0",
         "its port is --main-port"),
        ("orch launch", ["--nnodes", "1:4", "t.py"], "torchrun's elastic MIN:MAX",
         "-N 4 --min-nodes 1"),
    ],
)  # fmt: skip
def test_a_spelling_with_another_meaning_is_refused_with_the_right_one(path, args, said,
                                                                       hint) -> None:  # fmt: skip
    with pytest.raises(UsageError) as refused:
        _parsed(path, *args)
    assert said in refused.value.message
    assert refused.value.exit_code == 2
    if hint is not None:
        assert hint in (refused.value.hint or "")


def test_the_field_report_config_nodes_4_is_refused_and_writes_nothing(tmp_path, orch_here):
    result = orch_here(["config", "--nodes", "4", "--slots", "8", "-o", str(tmp_path / "c")],
                       tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "error: orch config takes the nodes by name" in result.stderr
    assert not (tmp_path / "c").exists()


def _hostfile(tmp_path: Path) -> str:
    path = tmp_path / "hostfile"
    path.write_text("a1 slots=2\na2 slots=2\n")
    return str(path)


def _plan(orch_here, tmp_path: Path, command: str, *args: str) -> dict[str, Any]:
    """`orch COMMAND --dry-run --json ARGS`: the options first, the script's come last."""
    result = orch_here([command, "--dry-run", "--json", *args], tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_launch_takes_torchruns_spellings_as_its_own(tmp_path, orch_here):
    plan = _plan(orch_here, tmp_path, "launch", "-H", _hostfile(tmp_path), "--launcher",
                 "torchrun", "--nproc_per_node", "1", "--master_port", "29611", "--nnodes", "1",
                 "t.py")  # fmt: skip
    assert (plan["world_size"], plan["main"], plan["hosts"]) == (
        1, "a1:29611", [{"host": "a1", "slots": 2}])  # fmt: skip


@pytest.mark.parametrize(("named", "launcher"), [("deepspeed", "pdsh"), ("accelerate", "standard")])
def test_the_launchers_by_their_tools_names(tmp_path, orch_here, named, launcher):
    plan = _plan(orch_here, tmp_path, "launch", "-H", _hostfile(tmp_path), "-l", named, "t.py")
    assert plan["launcher"] == launcher
    written = orch_here(["config", "-H", _hostfile(tmp_path), "-l", named, "-o",
                         str(tmp_path / named)], tmp_path)  # fmt: skip
    assert written.returncode == 0, written.stderr
    configs = sorted((tmp_path / named).glob("accelerate-*.yaml"))
    assert [p.name for p in configs] == (
        ["accelerate-pdsh.yaml"] if launcher == "pdsh"
        else ["accelerate-rank0.yaml", "accelerate-rank1.yaml"])  # fmt: skip


def test_launch_runs_on_a_node_set_with_ranks_per_node(tmp_path, orch_here):
    plan = _plan(orch_here, tmp_path, "launch", "-w", "n[1-3]", "--nproc-per-node", "2", "t.py")
    assert [h["host"] for h in plan["hosts"]] == ["n1", "n2", "n3"]
    assert (plan["world_size"], plan["main"].split(":")[0]) == (6, "n1")
    fewer = _plan(orch_here, tmp_path, "launch", "-w", "n[1-3]", "--nproc-per-node", "2",
                  "-N", "2", "t.py")  # fmt: skip
    assert [h["host"] for h in fewer["hosts"]] == ["n1", "n2"]
    slots = orch_here(["launch", "-w", "n[1-3]", "--dry-run", "t.py"], tmp_path / "runs")
    assert slots.returncode == 2 and "needs --nproc-per-node N" in slots.stderr
    both = orch_here(["launch", "-H", _hostfile(tmp_path), "-w", "a1", "--nproc-per-node", "1",
                      "--dry-run", "t.py"], tmp_path / "runs")  # fmt: skip
    assert both.returncode == 2 and "give --hostfile or -w/--nodelist, not both" in both.stderr
    assert "-i/--include" in both.stderr


def test_submit_takes_launchs_options_over_the_recipes_values(tmp_path, orch_here, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    recipe = str(REPO / "recipes" / "cpu-smoke.yaml")  # pdsh, the hostfile's slots, env: ...
    plan = _plan(orch_here, tmp_path, "submit", recipe, "-H", _hostfile(tmp_path),
                 "--launcher", "torchrun", "--nproc-per-node", "1",
                 "--python", "/opt/py/bin/python", "--workdir", "/srv/job",
                 "--env", "OMP_NUM_THREADS=4", "--env-keep", "OMP_NUM_THREADS",
                 "--env", "DS_ACCELERATOR", "--main-port", "29612")  # fmt: skip
    assert (plan["launcher"], plan["world_size"], plan["python"], plan["workdir"]) == (
        "torchrun", 2, "/opt/py/bin/python", "/srv/job")  # fmt: skip
    assert plan["main"] == "a1:29612"
    assert plan["env"]["OMP_NUM_THREADS"] == "4"  # the recipe's 1, overridden
    assert plan["env"]["DS_ACCELERATOR"] == "***"  # forwarded from here, not the recipe's cpu
    assert "cuda" not in json.dumps(plan)
    hosts = orch_here(["submit", recipe, "-w", "n[1-2]", "--nproc-per-node", "1", "--dry-run",
                       "--json"], tmp_path / "runs")  # fmt: skip
    assert [h["host"] for h in json.loads(hosts.stdout)["hosts"]] == ["n1", "n2"]


def test_a_recipe_with_a_node_set_under_nodes_names_its_file_and_line(tmp_path, orch_here):
    recipe = tmp_path / "old.yaml"
    recipe.write_text(yaml.safe_dump({"name": "old", "script": "t.py"}) + "nodes: gpu[01-04]\n")
    result = orch_here(["submit", str(recipe), "--dry-run"], tmp_path / "runs")
    assert result.returncode == 2
    assert f"{recipe}:3: 'nodes' is a count of nodes" in result.stderr
    assert "did you mean nodelist: gpu[01-04]?" in result.stderr
