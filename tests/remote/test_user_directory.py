"""Where the user's directory for orch is on a node (remote/owned.py choose_directory), and
that every program of orch there agrees on it: the settings writer, the agent, the port
reservations, the probe, the head's listing and hand fetch. When another user made
/tmp/orch-<uid> first, orch needs no root to go on: $XDG_RUNTIME_DIR/orch where that is the
user's own and lasts, or the user's ORCH_NODE_ROOT, which wins over both.

On real directories under a temporary directory standing in for the node's /tmp; a
directory of another user's is made by chown (as root), or planted as a link (anyone)."""

from __future__ import annotations

import os
import pwd
import shlex
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from _doctor_facts import facts

from orchestrator.checks.model import NodeProbe
from orchestrator.checks.node import check_own_directories
from orchestrator.plan.agent_command import node_files_command, port_command
from orchestrator.probe.facts import OwnDirectory
from orchestrator.remote import agent, agent_spec, node_files, owned, ports
from orchestrator.remote import probe as remote_probe
from orchestrator.run import collect

ME = os.getuid()
NOBODY = 65534
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")


@dataclass(frozen=True)
class Node:
    base: Path  # the node's /tmp, standing in
    linger: Path  # /var/lib/systemd/linger, standing in
    runtime: Path  # the user's $XDG_RUNTIME_DIR (set only by `with_runtime`)

    @property
    def default(self) -> Path:
        return self.base / f"orch-{ME}"


@pytest.fixture
def node(tmp_path: Path, monkeypatch) -> Node:
    base, linger = tmp_path / "tmp", tmp_path / "linger"
    base.mkdir()
    base.chmod(0o1777)
    linger.mkdir()
    monkeypatch.setattr(owned, "NODE_BASE", str(base))
    monkeypatch.setattr(owned, "LINGER_DIR", str(linger))
    monkeypatch.delenv(owned.RUNTIME_VAR, raising=False)
    monkeypatch.delenv(owned.ROOT_SETTING, raising=False)
    return Node(base, linger, tmp_path / "run-user")


def with_runtime(node: Node, monkeypatch, *, lingers: bool = True) -> Path:
    """A $XDG_RUNTIME_DIR as logind makes it: the user's, 0700; kept past the user's
    sessions when they linger."""
    node.runtime.mkdir(mode=0o700)
    monkeypatch.setenv(owned.RUNTIME_VAR, str(node.runtime))
    if lingers:
        (node.linger / pwd.getpwuid(ME).pw_name).touch()
    return node.runtime


def plant(path: Path, how: str, tmp_path: Path) -> None:
    """Another user's directory at `path`, made first: theirs by owner, or a link to theirs."""
    if how == "owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a directory away")
        path.mkdir(mode=0o755)
        os.chown(path, NOBODY, NOBODY)
    else:
        theirs = tmp_path / f"theirs-{path.name}"
        theirs.mkdir()
        path.symlink_to(theirs)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _shell_choice(root: str = "") -> str:
    """$u as the head's shell commands find it on this node."""
    script = owned.shell_user_directory(root) + 'printf %s "$u"'
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


# ----- another user's /tmp/orch-<uid>: $XDG_RUNTIME_DIR/orch instead --------------------
@pytest.mark.process
@pytest.mark.parametrize("how", ["owner", "link"])
def test_another_users_directory_moves_orch_into_the_runtime_directory(
    node: Node, monkeypatch, tmp_path: Path, how: str
) -> None:
    plant(node.default, how, tmp_path)
    runtime = with_runtime(node, monkeypatch)
    mine = runtime / owned.RUNTIME_NAME
    written = node_files.write("job-1", "n1", b'{"env": {}}', ME)
    where = mine / "runs" / "job-1" / "n1"
    assert written == str(where / agent_spec.PRIVATE_FILE)
    for level in (mine, mine / "runs", mine / "runs" / "job-1", where):
        assert _mode(level) == 0o700
    # The agent finds it there and works in it; its port reservation is there too.
    supervisor = agent.Supervisor(agent_spec.AgentSpec("job-1"), "n1", "0")
    assert supervisor._prepare() is None and supervisor.dir == where
    [port] = [p for p in range(29700, 29800) if ports.port_is_free(p)][:1]
    assert ports.choose(ports.own_dir_argument(), "job-1", 60, [port]) == {"port": port}
    assert (mine / "ports" / str(port)).read_text() == "job-1\n"
    # The head's listing (its shell) finds the same directory, and removes nothing else.
    assert _shell_choice() == str(mine)
    listed = subprocess.run(["sh", "-c", collect._hash_command("job-1", "n1")],
                            capture_output=True, timeout=30, check=False)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert collect._parse_hashes(listed.stdout)[0] == str(where)
    node_files.remove("job-1", "n1", ME)
    assert not where.exists() and (mine / "runs").is_dir()
    if how == "link":
        assert list((tmp_path / f"theirs-{node.default.name}").iterdir()) == []


def test_the_probe_says_where_orch_went_instead_and_doctor_warns(
    node: Node, monkeypatch, tmp_path: Path
) -> None:
    plant(node.default, "link", tmp_path)
    runtime = with_runtime(node, monkeypatch)
    runs, _ports = remote_probe.own_directories()
    assert runs["path"] == str(runtime / "orch" / "runs") and "problem" not in runs
    assert runs["instead_of"] == str(node.default) and "symbolic link" in runs["why"]
    places = tuple(OwnDirectory(**place) for place in (runs, _ports))
    [warning] = check_own_directories([NodeProbe("n1", facts("n1", own_dirs=places))])
    assert warning.severity == "warning" and str(node.default) in warning.problem
    assert str(runtime / "orch") in warning.problem and owned.ROOT_SETTING in warning.fix


# ----- no way around it: refused, naming what is wrong and the ways around -------------
@pytest.mark.process
@pytest.mark.parametrize("how", ["owner", "link"])
def test_a_runtime_directory_not_the_users_own_is_refused_naming_it(
    node: Node, monkeypatch, tmp_path: Path, how: str
) -> None:
    plant(node.default, "link", tmp_path)
    plant(node.runtime, how, tmp_path)
    monkeypatch.setenv(owned.RUNTIME_VAR, str(node.runtime))
    (node.linger / pwd.getpwuid(ME).pw_name).touch()
    with pytest.raises(owned.UnsafeDirectory) as refused:
        node_files.write("job-1", "n1", b"secret", ME)
    said = refused.value.problem
    assert str(node.default) in said.message and "symbolic link" in said.message
    assert f"$XDG_RUNTIME_DIR is no way around it: {node.runtime} " in said.message
    assert ("symbolic link" if how == "link" else "belongs to another user") in (
        said.message.split("XDG_RUNTIME_DIR")[1])
    assert owned.ROOT_SETTING in said.fix and f"rm -rf -- {node.default}" in said.fix
    assert _shell_choice() == str(node.default)  # the listing then refuses it (exit 5)


@pytest.mark.process
def test_a_runtime_directory_that_ends_with_the_session_is_no_way_around(
    node: Node, monkeypatch, tmp_path: Path
) -> None:
    plant(node.default, "link", tmp_path)
    runtime = with_runtime(node, monkeypatch, lingers=False)
    with pytest.raises(owned.UnsafeDirectory) as refused:
        node_files.write("job-1", "n1", b"secret", ME)
    said = refused.value.problem
    assert f"({runtime}) is no way around it: it is removed when your last session" in (
        said.message)
    assert "loginctl enable-linger" in said.fix and f"export {owned.ROOT_SETTING}=" in said.fix
    assert not (runtime / "orch").exists() and _shell_choice() == str(node.default)


@pytest.mark.parametrize("how", ["owner", "link"])
def test_doctor_names_another_users_directory_and_the_way_around(
    node: Node, tmp_path: Path, how: str
) -> None:
    plant(node.default, how, tmp_path)
    places = tuple(OwnDirectory(**place) for place in remote_probe.own_directories())
    findings = check_own_directories([NodeProbe("n1", facts("n1", own_dirs=places))])
    assert [f.severity for f in findings] == ["error", "error"]  # runs and ports
    finding = findings[0]
    kind = "belongs to another user" if how == "owner" else "symbolic link"
    assert str(node.default) in finding.problem and kind in finding.problem
    assert finding.fix.startswith(f"on n1: set {owned.ROOT_SETTING} on the head to a directory")
    assert f"rm -rf -- {node.default}, as its owner or root" in finding.fix


# ----- the user's setting wins -----------------------------------------------------------
@pytest.mark.process
def test_the_users_setting_wins_over_both(node: Node, monkeypatch, tmp_path: Path) -> None:
    runtime = with_runtime(node, monkeypatch)
    plant(node.default, "link", tmp_path)  # the runtime directory would do, but:
    root = tmp_path / "scratch" / "orch"
    root.parent.mkdir()
    written = node_files.write("job-1", "n1", b"x", ME, str(root))
    assert written == str(root / "runs" / "job-1" / "n1" / agent_spec.PRIVATE_FILE)
    assert _mode(root) == 0o700 and not (runtime / "orch").exists()
    spec = agent_spec.decode(agent_spec.encode(agent_spec.AgentSpec("job-1", node_root=str(root))))
    supervisor = agent.Supervisor(spec, "n1", "0")
    assert supervisor._prepare() is None and supervisor.dir == root / "runs" / "job-1" / "n1"
    argument = ports.own_dir_argument(str(root))
    assert ports.reservations_dir(argument, ME) == str(root / "ports")
    assert [d["path"] for d in remote_probe.own_directories(str(root))] == [
        str(root / "runs"), str(root / "ports")]  # fmt: skip
    listed = subprocess.run(["sh", "-c", collect._hash_command("job-1", "n1", str(root))],
                            capture_output=True, timeout=30, check=False)  # fmt: skip
    assert collect._parse_hashes(listed.stdout)[0] == str(root / "runs" / "job-1" / "n1")
    node_files.remove("job-1", "n1", ME, str(root))
    assert not (root / "runs" / "job-1").exists()


@pytest.mark.process
def test_the_setting_may_name_the_users_home_on_the_node(
    node: Node, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    assert owned.user_directory(ME, "~/.orch-node") == str(tmp_path / "home" / ".orch-node")
    assert _shell_choice("~/.orch-node") == str(tmp_path / "home" / ".orch-node")
    node_files.write("job-1", "n1", b"x", ME, "~/.orch-node")
    assert (tmp_path / "home" / ".orch-node" / "runs" / "job-1" / "n1").is_dir()
    assert not node.default.exists()


@pytest.mark.parametrize("how", ["owner", "link", "relative"])
def test_a_setting_that_names_no_place_of_the_users_own_is_refused(
    node: Node, tmp_path: Path, how: str
) -> None:
    root = tmp_path / "given"
    if how == "relative":
        setting, said = "scratch/orch", "'scratch/orch' is not an absolute path"
    else:
        plant(root, how, tmp_path)
        setting = str(root)
        said = "symbolic link" if how == "link" else "belongs to another user"
    with pytest.raises(owned.UnsafeDirectory) as refused:
        node_files.write("job-1", "n1", b"secret", ME, setting)
    assert refused.value.problem.message.startswith(owned.ROOT_SETTING)
    assert said in refused.value.problem.message
    assert owned.ROOT_SETTING in refused.value.problem.fix
    assert not node.default.exists()  # never a step back to the default: the user chose


# ----- one choice, however it is asked --------------------------------------------------
@pytest.mark.process
def test_the_shell_and_the_programs_choose_alike(node: Node, monkeypatch, tmp_path) -> None:
    assert _shell_choice() == owned.user_directory(ME) == str(node.default)  # not there yet
    node.default.mkdir(mode=0o700)
    assert _shell_choice() == owned.user_directory(ME) == str(node.default)  # the user's
    runtime = with_runtime(node, monkeypatch)
    assert _shell_choice() == owned.user_directory(ME) == str(node.default)  # still first
    node.default.chmod(0o777)  # writable by others: not the user's to trust
    assert _shell_choice() == owned.user_directory(ME) == str(runtime / "orch")
    assert _shell_choice("/x y/orch") == owned.user_directory(ME, "/x y/orch") == "/x y/orch"


def test_the_head_names_the_place_the_user_set() -> None:
    assert agent_spec.node_dir_shown("job-1", "n1") == "/tmp/orch-<uid>/runs/job-1/n1"
    shown = agent_spec.node_dir_shown("job-1", "n1", "~/.orch-node")
    assert shown == "~/.orch-node/runs/job-1/n1"
    said = collect.fetch_command("n1", "job-1", root="/x y/orch")
    [script] = shlex.split(said.removeprefix("ssh n1 ").removesuffix(" | tar -xf -"))
    assert script == "u='/x y/orch'; tar -C \"$u\"/runs/job-1 -cf - n1"


@pytest.mark.process
def test_the_shipped_programs_take_the_setting(tmp_path: Path) -> None:
    root = tmp_path / "mine"

    def run(command: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["sh", "-c", command], input=stdin, capture_output=True,
                              timeout=60, check=False)  # fmt: skip

    written = run(node_files_command(sys.executable, "write", "job-1", "here", str(root)), b"s")
    assert written.returncode == 0, written.stderr
    assert (root / "runs" / "job-1" / "here" / agent_spec.PRIVATE_FILE).read_bytes() == b"s"
    [port] = [p for p in range(29800, 29900) if ports.port_is_free(p)][:1]
    chosen = run(port_command(sys.executable, "job-1", ports.own_dir_argument(str(root)), 60,
                              (port,)))  # fmt: skip
    assert chosen.returncode == 0, chosen.stderr
    assert (root / "ports" / str(port)).read_text() == "job-1\n"
    refused = run(node_files_command(sys.executable, "write", "job-1", "here", "rel/x"), b"s")
    assert refused.returncode == 1
    assert b"ORCH_NODE_ROOT 'rel/x' is not an absolute path" in refused.stderr
