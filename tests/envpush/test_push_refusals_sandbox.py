"""`orch env push` refuses, before it sends anything, a node that cannot take the head's
environment, on sandbox nodes that really lack what it needs: the venv's base interpreter
is missing there, or is another Python version, or another ABI or machine, or the node's
disk where the environment goes is too small. Each refusal names the node and the fix, the
push exits non-zero, and nothing is written on the refused node. A good node beside it
gets the environment all the same. A conda environment (a prefix made from a Python build
of this machine: no conda can be installed here) is pushed to two nodes and runs there."""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.sandbox.cluster import Sandbox
from orchestrator.sandbox.state import SandboxState
from orchestrator.specs.units import format_bytes

pytestmark = pytest.mark.sandbox

ORCH = str(Path(sys.executable).with_name("orch"))
PAYLOAD = 3 << 20  # a file of the environment: more than the small disk holds
SMALL_DISK = 1 << 20
# Where other Python builds live on a Debian machine (and pyenv's, where it is used).
PYTHONS = ("/usr/bin", "/usr/local/bin", "/opt/*/bin", str(Path.home() / ".pyenv/versions/*/bin"))
# What a conda environment of Python needs not to run: tests, GUI, build files, packages.
NOT_IN_PREFIX = shutil.ignore_patterns(
    "__pycache__", "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
    "pydoc_data", "config-*", "site-packages", "dist-packages", "EXTERNALLY-MANAGED", "unittest",
    "distutils", "sqlite3", "curses", "venv", "xmlrpc", "wsgiref", "asyncio", "multiprocessing",
)  # fmt: skip


def _version(python: str) -> str:
    done = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    return done.stdout.strip()


def _pythons() -> list[Path]:
    """Every python3.N executable in the usual places, real files once each."""
    found: dict[str, Path] = {}
    for place in PYTHONS:
        for path in sorted(Path("/").glob(place.lstrip("/") + "/python3*")):
            if re.fullmatch(r"python3\.\d+d?", path.name) and os.access(path, os.X_OK):
                found.setdefault(os.path.realpath(path), path)
    return list(found.values())


def _release_and_debug() -> tuple[Path, Path] | None:
    """A release build of Python and a debug build of the same version (Debian's
    python3.N-dbg): the same version, another ABI (cpython-3Nd-...)."""
    for debug in _pythons():
        release = debug.with_name(debug.name[:-1])
        same = debug.name.endswith("d") and release.is_file()
        if same and _version(str(release)) == _version(str(debug)):
            return release, debug
    return None


def _other_version(version: str) -> Path | None:
    """A real interpreter of another Python version, another minor one if there is."""
    others = [(p, _version(str(p))) for p in _pythons() if not p.name.endswith("d")]
    others = [(p, v) for p, v in others if v and v != version]
    minor = version.rsplit(".", 1)[0]
    others.sort(key=lambda pv: pv[1].rsplit(".", 1)[0] == minor)
    return others[0][0] if others else None


@dataclass(frozen=True)
class Cluster:
    box: Sandbox
    state: SandboxState
    root: Path  # the head's venv
    base: Path  # its base interpreter, at a path of the head some nodes lack
    nodes: dict[str, str]  # role -> node name
    other_version: Path | None
    other_platform: str  # what the platform node's base interpreter is


def _venv(base: Path, root: Path) -> None:
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)  # fmt: skip
    site = next(root.glob("lib/python*/site-packages"))
    (site / "demo_pkg").mkdir()
    (site / "demo_pkg" / "__init__.py").write_text("VERSION = '1.0'\n")
    (site / "demo_pkg" / "weights.bin").write_bytes(bytes(range(256)) * (PAYLOAD // 256))


def _other_platform(own: Path, base: Path, debug: Path | None) -> str:
    """Make the platform node's base interpreter one of another platform. A debug build
    of the same version is a real interpreter of another ABI; without one, the release
    build runs under the kernel's 32-bit personality (`setarch linux32`), so that the node
    reports another machine (i686 on x86_64), as a 32-bit userland on a 64-bit kernel
    does. Returns which it is."""
    if debug is not None:
        (own / base.name).symlink_to(debug)
        return f"a debug build: {debug}"
    real = os.path.realpath(base)
    wrapper = own / base.name
    wrapper.write_text(f'#!/bin/sh\nexec setarch linux32 {shlex.quote(real)} "$@"\n')
    wrapper.chmod(0o755)
    return f"{real} under setarch linux32"


@pytest.fixture(scope="module")
def cluster(sandbox_factory, tmp_path_factory) -> Cluster:
    box, state = sandbox_factory(5, 1)
    roles = ("good", "missing", "version", "platform", "disk")
    nodes = dict(zip(roles, (n.name for n in state.nodes), strict=True))
    top = tmp_path_factory.mktemp("refusals")
    pair = _release_and_debug()
    release = Path(os.path.realpath(pair[0] if pair else sys._base_executable))
    bindir = top / "pybase" / "bin"  # the base interpreter's place: private on three nodes
    bindir.mkdir(parents=True)
    base = bindir / release.name
    base.symlink_to(release)
    root = top / "envs" / "train"
    root.parent.mkdir()
    _venv(base, root)
    for role, name in nodes.items():
        box.private_directory(name, root.parent, SMALL_DISK if role == "disk" else None)
    other_version = _other_version(_version(str(base)))
    box.private_directory(nodes["missing"], bindir)  # empty: the base interpreter is not there
    own = box.private_directory(nodes["version"], bindir)
    if other_version is not None:
        (own / base.name).symlink_to(other_version)
    own = box.private_directory(nodes["platform"], bindir)
    other_platform = _other_platform(own, base, pair[1] if pair else None)
    return Cluster(box, state, root, base, nodes, other_version, other_platform)


def run_push(state: SandboxState, root: Path, nodes: list[str], *extra: str
             ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [ORCH, "env", "push", "--hostfile", state.hostfile, "--python", str(root / "bin/python"),
         "--include", "@".join(nodes), *extra],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def on_node(node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", node, shlex.join(argv)], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def refused(cluster: Cluster, role: str) -> tuple[dict, str]:
    """Push to the good node and the node of `role`: the push exits 1, the good node has
    the environment, the other is refused by name with a fix, and nothing was written on
    it. Returns its --json entry and what the user reads without --json."""
    good, node = cluster.nodes["good"], cluster.nodes[role]
    shown = run_push(cluster.state, cluster.root, [good, node])
    done = run_push(cluster.state, cluster.root, [good, node], "--json")
    assert (shown.returncode, done.returncode) == (1, 1), shown.stdout + shown.stderr
    report = json.loads(done.stdout)
    entries = {n["node"]: n for n in report["nodes"]}
    assert report["ok"] is False and set(entries) == {good, node}
    assert entries[good]["ok"] is True and entries[good]["fingerprint"] == report["fingerprint"]
    entry = entries[node]
    assert entry["ok"] is False and entry["problem"].startswith(f"{node}: ")
    text = " ".join(shown.stdout.split())  # as read, whatever the terminal's width
    assert " ".join(entry["problem"].split()) in text
    assert "fix: " + " ".join(entry["fix"].split()) in text
    assert "Traceback" not in shown.stderr + done.stderr
    left = on_node(node, "ls", "-A", str(cluster.root.parent))
    assert left.returncode == 0 and left.stdout == "", f"{node} was written to: {left.stdout}"
    return entry, text


def test_a_node_without_the_base_interpreter_is_refused(cluster: Cluster) -> None:
    node = cluster.nodes["missing"]
    assert on_node(node, "test", "-e", str(cluster.base)).returncode == 1  # really not there
    entry, _ = refused(cluster, "missing")
    assert entry["problem"] == (
        f"{node}: the base interpreter {cluster.base} that the environment points to is not "
        f"on {node}"
    )
    assert entry["fix"].startswith(f"install the same Python at {cluster.base} on {node}")


def test_a_node_whose_base_interpreter_is_another_python_version_is_refused(
    cluster: Cluster,
) -> None:
    if cluster.other_version is None:
        pytest.skip(f"no Python but {_version(str(cluster.base))} on this machine")
    node = cluster.nodes["version"]
    theirs, ours = _version(str(cluster.other_version)), _version(str(cluster.base))
    assert on_node(node, str(cluster.base), "-V").stdout.split() == ["Python", theirs]
    entry, _ = refused(cluster, "version")
    assert entry["problem"] == (
        f"{node}: the base interpreter {cluster.base} is Python {theirs}, the head's "
        f"environment needs {ours}"
    )
    assert entry["fix"] == f"install Python {ours} at {cluster.base} on {node}"


def test_a_node_of_another_platform_is_refused(cluster: Cluster) -> None:
    node = cluster.nodes["platform"]
    facts = ("import platform, sysconfig; "
             "print(sysconfig.get_config_var('SOABI'), platform.machine())")  # fmt: skip
    theirs = on_node(node, str(cluster.base), "-c", facts).stdout.split()
    ours = subprocess.run([str(cluster.base), "-c", facts], capture_output=True, text=True,
                          timeout=60, check=True).stdout.split()  # fmt: skip
    assert theirs and theirs != ours, cluster.other_platform  # the node's is really another
    entry, _ = refused(cluster, "platform")
    assert entry["problem"].startswith(f"{node}: platform {theirs[0]}, ")
    assert entry["problem"].endswith(
        f"{theirs[1]} is not the head's {ours[0]}, {platform.libc_ver()[0]} "
        f"{platform.libc_ver()[1]}, {ours[1]}: binary wheels do not cross it"
    )
    assert entry["fix"] == (
        f"push from a head of the same platform, or build the environment on {node}"
    )


def test_a_node_whose_disk_is_too_small_is_refused_naming_what_is_needed(
    cluster: Cluster,
) -> None:
    node = cluster.nodes["disk"]
    df = on_node(node, "df", "--output=size", "-B1", str(cluster.root.parent))
    assert int(df.stdout.split()[-1]) == SMALL_DISK  # its own small filesystem
    files = [p for p in cluster.root.rglob("*") if p.is_file() and not p.is_symlink()]
    need = sum(p.stat().st_size for p in files)  # the links are sent as links
    entry, shown = refused(cluster, "disk")
    assert entry["problem"] == (
        f"{node}: {format_bytes(need)} to receive, {format_bytes(SMALL_DISK)} free where "
        f"{cluster.root} is"
    )
    assert entry["fix"] == f"free disk space on {node}"
    assert f"{format_bytes(need)} to receive, {format_bytes(SMALL_DISK)} free" in shown


# ----- a conda environment ----------------------------------------------------------------
def _conda_prefix(python: Path, prefix: Path) -> None:
    """A conda environment as it is on disk: a prefix holding its own Python (the
    interpreter, its standard library and extension modules, its libpython when the
    build has one) and `conda-meta/`. No conda or micromamba can be installed here (no
    Debian package, none on PyPI that makes environments, and no conda channel can be
    reached), so the prefix is made from this machine's own Python build, as conda's
    python package is laid out."""
    where = json.loads(subprocess.run(
        [str(python), "-c", "import json, sys, sysconfig; print(json.dumps([sys.executable, "
         "sysconfig.get_path('stdlib'), sysconfig.get_config_var('LIBDIR'), "
         "sysconfig.get_config_var('INSTSONAME') if sysconfig.get_config_var('Py_ENABLE_SHARED')"
         " else None, sysconfig.get_python_version()]))"],
        capture_output=True, text=True, timeout=60, check=True).stdout)  # fmt: skip
    executable, stdlib, libdir, soname, version = where
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(os.path.realpath(executable), prefix / "bin" / f"python{version}")
    for alias in ("python", "python3"):
        (prefix / "bin" / alias).symlink_to(f"python{version}")
    shutil.copytree(stdlib, prefix / "lib" / f"python{version}", symlinks=True,
                    ignore=NOT_IN_PREFIX)  # fmt: skip
    (prefix / "lib" / f"python{version}" / "site-packages").mkdir()
    if soname and (Path(libdir) / soname).is_file():
        shutil.copy2(Path(libdir) / soname, prefix / "lib" / soname)
    (prefix / "conda-meta").mkdir()
    (prefix / "conda-meta" / "history").write_text(
        f"==> 2024-01-01 00:00:00 <==\n# cmd: conda create -p {prefix} python={version}\n"
    )


@pytest.fixture(scope="module")
def conda_envs(cluster: Cluster, tmp_path_factory) -> Path:
    """A directory of conda environments, the own (empty) one of two nodes."""
    top = tmp_path_factory.mktemp("conda-envs")
    for role in ("good", "missing"):  # "missing" lacks the venv's base: conda needs none
        cluster.box.private_directory(cluster.nodes[role], top)
    return top


@pytest.mark.parametrize("python", ["head", "another"])
def test_a_conda_environment_is_pushed_runs_on_the_nodes_and_is_sent_once(
    cluster: Cluster, conda_envs: Path, python: str
) -> None:
    """The environment is a conda prefix made by hand (`_conda_prefix`), not by conda: its
    Python is the head's own build, or another version (a conda environment brings its own,
    whatever python3 the nodes have). Two nodes get it, run its Python from it, and a
    second push sends nothing."""
    build = cluster.base if python == "head" else cluster.other_version
    if build is None:
        pytest.skip(f"no Python but {_version(str(cluster.base))} on this machine")
    conda = conda_envs / python
    _conda_prefix(build, conda)
    nodes = [cluster.nodes["good"], cluster.nodes["missing"]]
    done = run_push(cluster.state, conda, nodes, "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, report
    assert report["kind"] == "conda" and report["root"] == str(conda)
    for entry in report["nodes"]:
        assert entry["ok"] and entry["sent_bytes"] > report["payload_bytes"] / 2, entry
        assert entry["fingerprint"] == report["fingerprint"]
    stdlib = next(conda.glob("lib/python3*/os.py"))
    for node in nodes:
        ran = on_node(node, str(conda / "bin/python"), "-c",
                      "import os, sys; print(sys.prefix, os.__file__)")  # fmt: skip
        assert ran.stdout.split() == [str(conda), str(stdlib)], ran.stderr
    again = run_push(cluster.state, conda, nodes, "--json")
    report = json.loads(again.stdout)
    assert again.returncode == 0 and report["head_sent_bytes"] == 0, report
    assert all(n["sent_files"] == 0 for n in report["nodes"])
