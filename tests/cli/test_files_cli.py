"""`orch hostfile` and `orch config` through the real entry point: files and exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from deepspeed.launcher.runner import fetch_hostfile

from orchestrator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
ORCH = str(Path(sys.executable).parent / "orch")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `orch ARGV` in this process through main(); returns (exit code, stdout, stderr)."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_hostfile_from_node_set_is_read_by_deepspeed(tmp_path: Path, capsys) -> None:
    target = tmp_path / "sub" / "hostfile"
    code, out, _ = run(capsys, "hostfile", "-w", "gpu[01-03],10.0.0.9", "--slots", "8",
                       "-o", str(target))  # fmt: skip
    assert code == 0
    assert out.strip() == str(target)
    assert list(fetch_hostfile(str(target)).items()) == [
        ("gpu01", 8), ("gpu02", 8), ("gpu03", 8), ("10.0.0.9", 8),
    ]  # fmt: skip


def test_hostfile_to_stdout_and_filters(tmp_path: Path, capsys) -> None:
    code, out, _ = run(capsys, "hostfile", "--nodelist", "n[1-3]", "--slots", "4",
                       "--include", "n1:0,1@n3")  # fmt: skip
    assert (code, out) == (0, "n1 slots=2\nn3 slots=4\n")
    source = tmp_path / "hf"
    source.write_text("n1 slots=4\nn2 slots=4\n")
    code, out, _ = run(capsys, "hostfile", "--from", str(source), "--exclude", "n2")
    assert (code, out) == (0, "n1 slots=4\n")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-w", "gpu[01-", "--slots", "8"], "cannot parse node set"),
        (["-w", "a,b", "--slots", "0"], "at least one slot"),
        (["-w", "a,b", "--slots", "many"], "give a number or 'auto'"),
        (["-w", "a,b"], "needs --slots"),
        ([], "give either -w/--nodelist or --from"),
        (["-w", "a;rm", "--slots", "1"], "not allowed"),
        (["-w", "a,b", "--slots", "1", "-i", "c"], "'c' is not in"),
        (["--from", "/nonexistent/hf"], "/nonexistent/hf: hostfile not found"),
    ],
)
def test_hostfile_usage_errors_exit_2(capsys, argv: list[str], words: str) -> None:
    code, out, err = run(capsys, "hostfile", *argv)
    assert code == 2
    assert out == ""
    assert "error:" in err and words in err


def test_hostfile_bad_line_names_file_and_line(tmp_path: Path, capsys) -> None:
    source = tmp_path / "hf"
    source.write_text("a slots=2\na slots=2\n")
    code, _, err = run(capsys, "hostfile", "--from", str(source))
    assert code == 2
    assert f"{source}:2: duplicate host 'a'" in err


def test_config_pdsh_from_hostfile(tmp_path: Path, capsys) -> None:
    hostfile = tmp_path / "hf"
    hostfile.write_text("n1 slots=8\nn2 slots=8\n")
    out_dir = tmp_path / "cfg"
    code, out, err = run(
        capsys,
        "config",
        "--hostfile",
        str(hostfile),
        "-o",
        str(out_dir),
        "--zero-stage",
        "3",
        "--mixed-precision",
        "fp16",
        "--main-port",
        "21011",
    )
    assert code == 0, err
    assert out.split() == [str(out_dir / "accelerate-pdsh.yaml")]
    config = load_config_from_file(str(out_dir / "accelerate-pdsh.yaml"))
    assert (config.num_machines, config.num_processes, config.main_process_ip) == (2, 16, "n1")
    assert config.main_process_port == 21011
    assert config.deepspeed_config["deepspeed_hostfile"] == str(hostfile)
    assert config.deepspeed_config["zero_stage"] == 3
    assert config.mixed_precision == "fp16"


def test_config_from_node_set_writes_the_hostfile_it_names(tmp_path: Path, capsys) -> None:
    code, out, err = run(capsys, "config", "-w", "n[1-2]", "--slots", "2", "-o", str(tmp_path))
    assert code == 0, err
    config = load_config_from_file(str(tmp_path / "accelerate-pdsh.yaml"))
    named = config.deepspeed_config["deepspeed_hostfile"]
    assert named == str(tmp_path / "hostfile")
    assert dict(fetch_hostfile(named)) == {"n1": 2, "n2": 2}
    assert set(out.split()) == {named, str(tmp_path / "accelerate-pdsh.yaml")}


def test_config_standard_writes_one_per_rank(tmp_path: Path, capsys) -> None:
    hostfile = tmp_path / "hf"
    hostfile.write_text("n1 slots=8\nn2 slots=8\nn3 slots=8\n")
    code, out, err = run(capsys, "config", "--hostfile", str(hostfile), "--launcher", "standard",
                         "--num-processes", "12", "-o", str(tmp_path / "c"))  # fmt: skip
    assert code == 0, err
    paths = out.split()
    assert paths == [str(tmp_path / "c" / f"accelerate-rank{k}.yaml") for k in range(3)]
    texts = [Path(p).read_text() for p in paths]
    for rank, path in enumerate(paths):
        config = load_config_from_file(path)
        assert (config.machine_rank, config.num_processes) == (rank, 12)
        assert texts[rank].replace(f"machine_rank: {rank}", "machine_rank: 0") == texts[0]


def test_config_from_recipe(tmp_path: Path, capsys) -> None:
    recipe = ROOT / "recipes" / "diffsynth-wan22-i2v-4x8.yaml"
    code, out, err = run(capsys, "config", "--recipe", str(recipe), "-o", str(tmp_path))
    assert code == 0, err
    configs = [load_config_from_file(p) for p in out.split()]
    assert [c.machine_rank for c in configs] == [0, 1, 2, 3]
    assert {c.num_processes for c in configs} == {32}
    assert {c.main_process_port for c in configs} == {12345}


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--num-processes", "7"], "not a multiple of the 2 machines"),
        (["--main-port", "70000"], "out of range"),
        (["--launcher", "torchrun"], "takes no accelerate config"),
        (["--nproc-per-node", "9"], "has only 8 slots"),
        (["--zero-stage", "1", "--offload-optimizer", "cpu"], "needs zero_stage 2 or 3"),
        (["--distributed-type", "MULTI_GPU"], "cannot use it"),
        (
            ["--recipe", str(ROOT / "recipes" / "cpu-smoke.yaml"), "--zero-stage", "3"],
            "drop --zero-stage",
        ),
    ],
)
def test_config_inconsistent_values_write_nothing(
    tmp_path: Path, capsys, argv: list[str], words: str
) -> None:
    hostfile = tmp_path / "hf"
    hostfile.write_text("n1 slots=8\nn2 slots=8\n")
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, "config", "--hostfile", str(hostfile), "-o", str(out_dir), *argv)
    assert code == 2
    assert words in err
    assert out == ""
    assert not out_dir.exists()


def test_config_without_hosts_is_a_usage_error(tmp_path: Path, capsys) -> None:
    code, _, err = run(capsys, "config", "-o", str(tmp_path))
    assert code == 2
    assert "no hosts" in err


@pytest.mark.process
def test_real_console_script() -> None:
    """The installed `orch` reaches these commands and maps usage errors to exit 2."""
    bad = subprocess.run(
        [ORCH, "hostfile", "-w", "a[1-", "--slots", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "error: cannot parse node set 'a[1-'" in bad.stderr
    assert bad.stdout == ""


@pytest.mark.sandbox
def test_slots_auto_without_gpus_says_so(sandbox, capsys) -> None:
    _, state = sandbox
    names = ",".join(node.name for node in state.nodes)
    code, out, err = run(capsys, "hostfile", "-w", names, "--slots", "auto")
    assert code == 1, err
    assert out == ""
    for node in state.nodes:
        assert f"{node.name}: no GPUs found" in err
    assert "--slots" in err


@pytest.mark.sandbox
def test_slots_auto_reports_every_bad_node(sandbox, capsys) -> None:
    _, state = sandbox
    names = ",".join([state.nodes[0].name, "orch-no-such-node", state.nodes[1].name])
    code, out, err = run(capsys, "hostfile", "-w", names, "--slots", "auto",
                         "--timeout", "5")  # fmt: skip
    assert code == 1
    assert out == ""
    assert "orch-no-such-node" in err
    assert f"{state.nodes[0].name}: no GPUs found" in err
    assert f"{state.nodes[1].name}: no GPUs found" in err
