"""The defaults a user keeps (ORCH_HOSTFILE, a project's orch.toml, ~/.config/orch/config.toml)
as `orch launch` and `orch submit` take them: under the command line and a recipe's values,
each one used said with where it came from, a bad file refused naming its line and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_support import REPO

from orchestrator.cli.user_defaults import default_runs_dir, read_defaults
from orchestrator.specs.defaults import Defaults, Setting


def _hostfile(tmp_path: Path, name: str, *hosts: str) -> Path:
    path = tmp_path / name
    path.write_text("".join(f"{host} slots=2\n" for host in hosts))
    return path


def _user_file(runs: Path, text: str) -> Path:
    """The user's config.toml, where the orch_here fixture points XDG_CONFIG_HOME."""
    path = Path(f"{runs}.config") / "orch" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _plan(result) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _hosts(plan: dict) -> list[str]:
    return [host["host"] for host in plan["hosts"]]


def test_the_users_file_gives_the_hostfile_launcher_and_python_and_says_so(tmp_path, orch_here):
    runs = tmp_path / "runs"
    hostfile = _hostfile(tmp_path, "cluster", "a1", "a2")
    config = _user_file(runs, f'hostfile = "{hostfile}"\nlauncher = "torchrun"\n'
                              'python = "/opt/venv/bin/python"\n')  # fmt: skip
    result = orch_here(["launch", "--dry-run", "--json", "train.py"], runs)
    plan = _plan(result)
    assert _hosts(plan) == ["a1", "a2"] and plan["launcher"] == "torchrun"
    assert plan["rank_command"][0] == "/opt/venv/bin/python"
    assert f"default: --hostfile {hostfile} (from {config}:1)" in result.stderr
    assert f"default: --launcher torchrun (from {config}:2)" in result.stderr
    assert f"default: --python /opt/venv/bin/python (from {config}:3)" in result.stderr


def test_the_command_line_beats_orch_hostfile_which_beats_the_users_file(tmp_path, orch_here,
                                                                        monkeypatch):  # fmt: skip
    runs = tmp_path / "runs"
    _user_file(runs, f'hostfile = "{_hostfile(tmp_path, "user", "u1")}"\n')
    monkeypatch.setenv("ORCH_HOSTFILE", str(_hostfile(tmp_path, "env", "e1")))
    from_env = orch_here(["launch", "--dry-run", "--json", "train.py"], runs)
    assert _hosts(_plan(from_env)) == ["e1"]
    assert "(from ORCH_HOSTFILE)" in from_env.stderr
    given = _hostfile(tmp_path, "given", "g1")
    typed = orch_here(["launch", "-H", str(given), "--dry-run", "--json", "train.py"], runs)
    assert _hosts(_plan(typed)) == ["g1"] and "default:" not in typed.stderr
    nodelist = orch_here(["launch", "-w", "w[1-2]", "--nproc-per-node", "1", "--dry-run",
                          "--json", "train.py"], runs)  # fmt: skip
    assert _hosts(_plan(nodelist)) == ["w1", "w2"] and "default:" not in nodelist.stderr


def test_a_recipe_keeps_its_launcher_and_the_defaults_fill_what_it_leaves(tmp_path, orch_here):
    runs = tmp_path / "runs"
    hostfile = _hostfile(tmp_path, "cluster", "a1", "a2")
    _user_file(runs, f'hostfile = "{hostfile}"\nlauncher = "torchrun"\npython = "/opt/py"\n')
    recipe = str(REPO / "recipes" / "cpu-smoke.yaml")  # launcher: pdsh, no hosts, no python
    result = orch_here(["submit", recipe, "--dry-run", "--json"], runs)
    plan = _plan(result)
    assert plan["launcher"] == "pdsh" and _hosts(plan) == ["a1", "a2"]
    assert plan["rank_command"][0] == "/opt/py"
    assert "--launcher" not in result.stderr


def test_a_bad_defaults_file_is_refused_with_its_line_and_the_fix(tmp_path, orch_here):
    runs = tmp_path / "runs"
    config = _user_file(runs, '# mine\nhostfle = "hf"\n')
    result = orch_here(["launch", "--dry-run", "train.py"], runs)
    assert result.returncode == 2
    assert f"{config}:2: unknown key 'hostfle'" in result.stderr
    assert "did you mean 'hostfile'?" in result.stderr


def test_a_projects_file_beats_the_users(tmp_path):
    (tmp_path / "orch.toml").write_text('launcher = "standard"\n')
    user = tmp_path / "cfg" / "orch" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('launcher = "torchrun"\npython = "/u/py"\n')
    got = read_defaults({"XDG_CONFIG_HOME": str(tmp_path / "cfg")}, cwd=tmp_path, home=tmp_path)
    assert got.launcher == Setting("standard", f"{tmp_path}/orch.toml:1")
    assert got.python == Setting("/u/py", f"{user}:2")
    assert read_defaults({}, cwd=tmp_path / "cfg", home=tmp_path / "none").launcher is None


@pytest.mark.process  # doctor runs the head's interpreter to read its environment
def test_doctor_takes_the_default_hostfile_and_says_so(tmp_path, orch_here, monkeypatch):
    hostfile = tmp_path / "hf"
    hostfile.write_text("nohost.invalid slots=1\n")  # a name that never resolves: no wait
    monkeypatch.setenv("ORCH_HOSTFILE", str(hostfile))
    result = orch_here(["doctor", "--timeout", "2", "--json"], tmp_path / "runs")
    assert result.returncode == 1
    assert f"default: --hostfile {hostfile} (from ORCH_HOSTFILE)" in result.stderr
    assert [node["node"] for node in json.loads(result.stdout)["nodes"]] == ["nohost.invalid"]


def test_the_runs_dir_default_comes_after_orch_runs_dir():
    defaults = Defaults(runs_dir=Setting("/p/runs", "/p/orch.toml:4"))
    said: list[str] = []
    assert default_runs_dir(defaults, None, said=said, environ={}) == Path("/p/runs")
    assert said == ["default: --runs-dir /p/runs (from /p/orch.toml:4)"]
    assert default_runs_dir(defaults, None, said=[], environ={"ORCH_RUNS_DIR": "/e"}) is None
    assert default_runs_dir(defaults, Path("/given"), said=[], environ={}) == Path("/given")


def test_a_batch_job_takes_its_nodes_from_slurm_not_the_default_hostfile(tmp_path, orch_here,
                                                                        monkeypatch):  # fmt: skip
    monkeypatch.setenv("ORCH_HOSTFILE", str(_hostfile(tmp_path, "env", "e1")))
    recipe = str(REPO / "recipes" / "cpu-smoke-slurm.yaml")
    result = orch_here(["submit", recipe, "--sbatch", "-N", "2", "--dry-run"], tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH" in result.stdout and "--hostfile" not in result.stderr


def test_config_takes_the_default_hostfile_and_a_launcher_it_can_write_for(tmp_path, orch_here):
    runs = tmp_path / "runs"
    hostfile = _hostfile(tmp_path, "cluster", "a1", "a2")
    config = _user_file(runs, f'hostfile = "{hostfile}"\nlauncher = "standard"\n')
    out = tmp_path / "configs"
    result = orch_here(["config", "-o", str(out)], runs)
    assert result.returncode == 0, result.stderr
    assert f"default: --launcher standard (from {config}:2)" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["accelerate-rank0.yaml",
                                                     "accelerate-rank1.yaml"]  # fmt: skip
    _user_file(runs, f'hostfile = "{hostfile}"\nlauncher = "torchrun"\n')  # none to write
    pdsh = orch_here(["config", "-o", str(tmp_path / "pdsh")], runs)
    assert pdsh.returncode == 0, pdsh.stderr
    assert "--launcher" not in pdsh.stderr and (tmp_path / "pdsh" / "accelerate-pdsh.yaml").exists()
