"""Recipes: validation with file and line, and every shipped recipe renders configs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import load_config_from_file
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import InputFileError, UsageError
from orchestrator.plan.accel_config import render_accelerate_config, render_standard_configs
from orchestrator.specs.constants import DEFAULT_MAIN_PORT
from orchestrator.specs.inventory import make_hostfile, processes_per_node, render_hostfile
from orchestrator.specs.recipe import (
    EXAMPLE_RECIPES,
    KEYS_REFERENCE,
    Recipe,
    load_recipe,
    parse_recipe,
    recipe_hosts,
    section_keys,
)

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
EXPECTED = {
    "cpu-smoke",
    "cpu-smoke-slurm",
    "diffsynth-wan22-i2v-4x8",
    "deepspeed-zero3-fp16-pdsh-2x8",
    "amphion-multigpu-c10d",
    "sana-torchrun-c10d",
    "opensora-colossalai-zero2",
    "opensora-colossalai-hybrid-tp2",
}


def test_every_expected_recipe_is_shipped() -> None:
    assert {path.stem for path in RECIPES} >= EXPECTED


def _configs(recipe: Recipe, tmp_path: Path) -> list[Path]:
    """Render the recipe's accelerate config(s) the way a launch would, and write them."""
    hosts = recipe_hosts(recipe) if recipe.nodelist else make_hostfile(["n1", "n2"], 2)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(render_hostfile(hosts))
    common = {
        "hosts": hosts,
        "nproc_per_node": processes_per_node(hosts, recipe.nproc_per_node),
        "main_ip": hosts.names[0],
        "main_port": recipe.main_port or DEFAULT_MAIN_PORT,  # none: orch picks one per job
    }
    if recipe.launcher == "pdsh":
        texts = [
            render_accelerate_config(
                recipe.accelerate, launcher="pdsh", hostfile_path=str(hostfile), **common
            )
        ]
    else:
        texts = render_standard_configs(recipe.accelerate, **common)
    paths = []
    for rank, text in enumerate(texts):
        path = tmp_path / f"accelerate-{rank}.yaml"
        path.write_text(text)
        paths.append(path)
    return paths


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_shipped_recipe_validates_and_renders(path: Path, tmp_path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    assert recipe.source == str(path)
    assert path.read_text().startswith("#"), "each recipe says where it comes from"
    if recipe.launcher == "torchrun":
        assert recipe.torchrun.rdzv_backend == "c10d"
        return
    for config_path in _configs(recipe, tmp_path):
        config = load_config_from_file(str(config_path))
        assert config.distributed_type == recipe.accelerate.distributed_type
        assert config.main_process_port == (recipe.main_port or DEFAULT_MAIN_PORT)


def test_diffsynth_recipe_gives_four_rank_configs_of_32_processes(tmp_path: Path) -> None:
    recipe = load_recipe(ROOT / "recipes" / "diffsynth-wan22-i2v-4x8.yaml")
    assert recipe.launcher == "standard"
    assert recipe.env["NCCL_IB_DISABLE"] == "0"
    assert recipe.env["NCCL_IB_GID_INDEX"] == "3"
    assert recipe.env["NCCL_SOCKET_IFNAME"] == "eth0"
    configs = [load_config_from_file(str(p)) for p in _configs(recipe, tmp_path)]
    assert [c.machine_rank for c in configs] == [0, 1, 2, 3]
    for config in configs:
        assert (config.num_machines, config.num_processes) == (4, 32)
        assert config.main_process_port == 12345
        assert config.mixed_precision == "bf16"
        assert config.deepspeed_config["zero_stage"] == 2
        assert config.deepspeed_config["offload_optimizer_device"] == "cpu"
        assert config.deepspeed_config["offload_param_device"] == "cpu"
        assert config.dynamo_config["dynamo_backend"] == "INDUCTOR"


def test_pdsh_seed_recipe_matches_the_seed(tmp_path: Path) -> None:
    recipe = load_recipe(ROOT / "recipes" / "deepspeed-zero3-fp16-pdsh-2x8.yaml")
    (config_path,) = _configs(recipe, tmp_path)
    config = load_config_from_file(str(config_path))
    assert (config.num_machines, config.num_processes, config.main_process_port) == (2, 16, 21011)
    assert config.mixed_precision == "fp16"
    assert config.deepspeed_config["deepspeed_multinode_launcher"] == "pdsh"
    assert config.deepspeed_config["deepspeed_hostfile"] == str(tmp_path / "hostfile")
    assert config.deepspeed_config["zero_stage"] == 3
    assert config.deepspeed_config["zero3_save_16bit_model"] is True


def test_recipe_dir_is_expanded() -> None:
    recipe = load_recipe(ROOT / "recipes" / "cpu-smoke.yaml")
    assert recipe.script == str(ROOT / "recipes" / "scripts" / "cpu_smoke.py")
    assert Path(recipe.script).is_file()


MINIMAL = "name: r\nscript: train.py\n"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (MINIMAL + "launcer: pdsh\n", 3, "unknown key 'launcer'"),
        (MINIMAL + "accelerate:\n  zero_stage: 2\n  zero_stag: 3\n", 5, "'accelerate.zero_stag'"),
        (MINIMAL + "accelerate:\n  zero_stage: 5\n", 4, "accelerate.zero_stage"),
        (MINIMAL + "main_port: 70000\n", 3, "main_port"),
        (MINIMAL + "nproc_per_node: 0\n", 3, "nproc_per_node"),
        (MINIMAL + "launcher: slurm\n", 3, "launcher"),
        (MINIMAL + "env:\n  OK: 1\n  BAD NAME: x\n", 3, "invalid environment variable name"),
        (MINIMAL + "env:\n  FLAG: true\n", 3, "in quotes"),
        (MINIMAL + "env:\n  ORCH_JOB_ID: x\n", 3, "set by orch"),
        (MINIMAL + "nodelist: gpu[01-\n", 3, "cannot parse node set"),
        # A node set and a count in each other's key: the message says which key means it.
        (MINIMAL + "nodes: 'gpu[01-04]'\n", 3, "'nodes' is a count of nodes"),
        (MINIMAL + "nodes: 4\n", 3, "a count of nodes goes under recovery:"),
        (MINIMAL + "nodelist: 4\n", 3, "nodelist: 4 is a count"),
        (MINIMAL + "nodelist: '4'\n", 3, "nodelist: 4 is a count"),
        (MINIMAL + "slurm:\n  nodes: gpu[1-2]\n", 4, "slurm.nodes: 'gpu[1-2]' is a node set"),
        (MINIMAL + "recovery:\n  nodes: n1,n2\n", 4, "top-level key nodelist: n1,n2"),
        (MINIMAL + "args: [a, [b]]\n", 3, "args.1"),
        (
            MINIMAL + "launcher: pdsh\naccelerate:\n  distributed_type: MULTI_GPU\n",
            4,
            "distributed_type must be DEEPSPEED",
        ),
        (
            MINIMAL + "accelerate:\n  zero_stage: 1\n  offload_param_device: cpu\n",
            5,
            "needs zero_stage 2 or 3",
        ),
        ("name: r\nscript: train.py\nname: s\n", 3, "duplicate key 'name' (first on line 1)"),
        ("name: r\nscript: [unclosed\n", 3, "not valid YAML"),
        ("- a\n- b\n", 1, "a recipe is a YAML mapping"),
    ],
)
def test_recipe_errors_name_file_and_line(text: str, line: int, words: str) -> None:
    with pytest.raises(InputFileError) as info:
        parse_recipe(text, source="bad.yaml")
    assert info.value.line == line, info.value.message
    assert info.value.message.startswith(f"bad.yaml:{line}: ")
    assert words in info.value.message
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        (MINIMAL + "launcer: pdsh\n", "did you mean 'launcher'? see recipes/cpu-resume.yaml"),
        (MINIMAL + "accelerate:\n  zero_stag: 3\n",
         "did you mean 'zero_stage'? see recipes/diffsynth-wan22-i2v-4x8.yaml"),
        (MINIMAL + "recovery:\n  max_restart: 1\n",
         "did you mean 'max_restarts'? see recipes/cpu-resume.yaml"),
        # A key of another section: where it goes, and a recipe that has that section.
        (MINIMAL + "zero_stage: 3\n",
         "'zero_stage' goes in the accelerate: section; see recipes/diffsynth-wan22-i2v-4x8"),
        (MINIMAL + "accelerate:\n  hang_timeout: 3\n", "'hang_timeout' goes at the top level"),
        (MINIMAL + "colour: red\n", "see recipes/cpu-resume.yaml for an example"),
    ],
)  # fmt: skip
def test_a_misspelled_key_gets_its_likely_spelling_and_an_example(text: str, hint: str) -> None:
    with pytest.raises(InputFileError) as info:
        parse_recipe(text, source="bad.yaml")
    assert info.value.hint is not None and info.value.hint.startswith(hint), info.value.hint
    assert info.value.hint.endswith("docs/reference/recipes.md for every key")


def _section_shown(path: Path, section: tuple) -> set:
    shown = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key in section:
        shown = shown.get(key) or {}
    return set(shown)


@pytest.mark.parametrize("section", list(EXAMPLE_RECIPES))
def test_the_example_recipe_of_a_section_shows_most_of_its_keys(section: tuple) -> None:
    keys = set(section_keys()[section])
    example = len(_section_shown(ROOT / EXAMPLE_RECIPES[section], section) & keys)
    assert example >= 2 and all(len(_section_shown(path, section) & keys) <= example
                                for path in RECIPES)  # fmt: skip


def test_the_keys_reference_names_every_key() -> None:
    page = (ROOT / KEYS_REFERENCE).read_text(encoding="utf-8")
    missing = [key for keys in section_keys().values() for key in keys if f"`{key}`" not in page]
    assert missing == []


def test_variables_are_the_heads_and_an_unset_one_is_refused_at_its_line() -> None:
    text = MINIMAL + "args:\n  - --data\n  - ${DATA}/set\n  - $${DATA}\nenv: {OUT: '${HOME}/o'}\n"
    recipe = parse_recipe(text, source="r.yaml", environ={"DATA": "/d", "HOME": "/h"})
    assert recipe.args == ["--data", "/d/set", "${DATA}"]  # $${NAME}: the text itself
    assert recipe.env == {"OUT": "/h/o"}
    with pytest.raises(InputFileError) as info:
        parse_recipe(text, source="r.yaml", environ={"HOME": "/h"})
    assert info.value.line == 5 and info.value.exit_code == 2
    assert info.value.message == (
        "r.yaml:5: args.1: ${DATA} in '${DATA}/set' is not set on the head (orch takes "
        "${NAME} from the environment orch runs in)"
    )
    assert info.value.hint == ("export DATA=... before running orch, or write $${DATA} for the "
                               "text ${DATA} itself")  # fmt: skip


def test_a_recipe_read_from_a_file_takes_the_given_environment(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nscript: ${RECIPE_DIR}/${SUB}/t.py\n")
    assert load_recipe(path, {"SUB": "s"}).script == f"{tmp_path}/s/t.py"
    with pytest.raises(InputFileError, match=r"\$\{SUB\}"):
        load_recipe(path, {})


def test_missing_required_key() -> None:
    with pytest.raises(InputFileError, match="missing required key 'script'"):
        parse_recipe("name: r\n", source="bad.yaml")


def test_missing_recipe_file(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="recipe not found"):
        load_recipe(tmp_path / "nope.yaml")


def test_defaults_and_numbers_as_text() -> None:
    recipe = parse_recipe(MINIMAL + "args: [--steps, 30, --lr, 0.5]\nenv: {NCCL_IB_GID_INDEX: 3}\n")
    assert recipe.args == ["--steps", "30", "--lr", "0.5"]
    assert recipe.env == {"NCCL_IB_GID_INDEX": "3"}
    assert recipe.launcher == "pdsh"
    assert recipe.main_port is None  # orch picks one per job
    assert recipe.accelerate.distributed_type == "DEEPSPEED"
    assert recipe.nproc_per_node is None


def test_recipe_hosts_priority(tmp_path: Path) -> None:
    hostfile = tmp_path / "hf"
    hostfile.write_text("a slots=2\nb slots=2\n")
    recipe = parse_recipe(MINIMAL + f"hostfile: {hostfile}\nnodelist: x[1-3]\nnproc_per_node: 4\n")
    assert recipe_hosts(recipe).names == ("a", "b")
    other = tmp_path / "other"
    other.write_text("c slots=1\n")
    assert recipe_hosts(recipe, other).names == ("c",)
    by_nodes = parse_recipe(MINIMAL + "nodelist: x[1-3]\nnproc_per_node: 4\n")
    assert recipe_hosts(by_nodes) == make_hostfile(["x1", "x2", "x3"], 4)
    with pytest.raises(InputFileError, match="nproc_per_node"):
        recipe_hosts(parse_recipe(MINIMAL + "nodelist: x[1-3]\n"))
    with pytest.raises(UsageError, match="names no hosts"):
        recipe_hosts(parse_recipe(MINIMAL))


def test_the_hint_of_a_node_set_under_nodes_is_the_key_that_takes_it() -> None:
    with pytest.raises(InputFileError) as top:
        parse_recipe(MINIMAL + "nodes: gpu[01-04]\n", source="r.yaml")
    assert top.value.hint == "did you mean nodelist: gpu[01-04]?"
    with pytest.raises(InputFileError) as count:
        parse_recipe(MINIMAL + "nodes: 4\n", source="r.yaml")
    assert count.value.hint == "did you mean recovery: {nodes: 4}?"


def test_the_launchers_by_their_tools_names() -> None:
    assert parse_recipe(MINIMAL + "launcher: deepspeed\n").launcher == "pdsh"
    assert parse_recipe(MINIMAL + "launcher: accelerate\n").launcher == "standard"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_cpu_smoke_trains_with_the_config_orch_writes(tmp_path: Path) -> None:
    """One machine, two ranks: accelerate + DeepSpeed ZeRO-2 on CPU really trains."""
    recipe = load_recipe(ROOT / "recipes" / "cpu-smoke.yaml")
    hosts = make_hostfile(["localhost"], 2)
    (text,) = render_standard_configs(
        recipe.accelerate,
        hosts=hosts,
        nproc_per_node=2,
        main_ip="127.0.0.1",
        main_port=_free_port(),
    )
    config = tmp_path / "accelerate.yaml"
    config.write_text(text)
    accelerate = str(Path(sys.executable).parent / "accelerate")
    env = {**os.environ, **recipe.env}
    argv = [accelerate, "launch", "--config_file", str(config), recipe.script, "--steps", "20"]
    # Own session, so that a timeout takes down every rank, not only the launcher.
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    try:
        # Generous: the first run on a machine JIT-builds DeepSpeed's CPU op.
        stdout, stderr = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    done = subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "final loss" in done.stdout
    assert "rank 1/2" in done.stdout


def test_aliases_and_merge_keys_are_fine() -> None:
    text = MINIMAL + "env: &e {A: '1'}\nx: &r [*r]\n"
    with pytest.raises(InputFileError, match="unknown key 'x'"):
        parse_recipe(text, source="r.yaml")
    merged = parse_recipe(MINIMAL + "accelerate:\n  <<: {zero_stage: 3}\n  mixed_precision: fp16\n")
    assert merged.accelerate.zero_stage == 3


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_arbitrary_text_raises_only_project_errors(text: str) -> None:
    try:
        parse_recipe(text, source="fuzz.yaml")
    except InputFileError as err:
        assert err.message.startswith("fuzz.yaml")


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "name",
                "script",
                "args",
                "launcher",
                "env",
                "main_port",
                "accelerate",
                "nodes",
                "nproc_per_node",
                "torchrun",
                "bogus",
            ]
        ),
        st.none()
        | st.integers(-5, 70000)
        | st.text(max_size=10)
        | st.booleans()
        | st.lists(st.text(max_size=5), max_size=3)
        | st.dictionaries(st.text(max_size=8), st.integers(0, 5) | st.text(max_size=5), max_size=3),
    )
)
def test_arbitrary_recipe_shapes_raise_only_project_errors(data: dict) -> None:
    try:
        parse_recipe(yaml.safe_dump(data), source="fuzz.yaml")
    except InputFileError as err:
        assert err.message.startswith("fuzz.yaml")
