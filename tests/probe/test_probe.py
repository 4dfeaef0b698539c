"""The node probe: its JSON parsed into NodeFacts, and the real program on real nodes."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from _shipped import not_loaded_before

from orchestrator.prepare.preflight import probe_nodes
from orchestrator.probe.commands import PROBE_PARTS, listen_request, probe_command
from orchestrator.probe.facts import ProbeError, parse_facts

SAMPLE = {
    "probe_version": 1,
    "hostname": "gpu1",
    "os": "Ubuntu 22.04.4 LTS",
    "kernel": "5.15.0",
    "python": {"requested": "/opt/py", "found": True, "executable": "/opt/py",
               "version": "3.11.7"},
    "packages": {"torch": "2.3.1+cu121", "accelerate": "1.15.0", "transformers": None},
    "torch_cuda": "12.1",
    "gpu": {
        "status": "ok",
        "gpus": [{"index": "0", "name": "NVIDIA H100", "driver": "550.54", "memory_used_mib": "1",
                  "uuid": "GPU-a"}],
        "busy": [{"uuid": "GPU-a", "pid": "777"}],
    },
    "disk": {"path": "/work", "free_bytes": 123},
    "workdir": {"path": "/work", "exists": True},
    "script": {"path": "/work/t.py", "exists": True, "sha256": "ff", "size": 3},
    "interfaces": {"lo": ["127.0.0.1"], "ib0": ["10.1.0.1"]},
    "ib_devices": ["mlx5_0"],
    "resolve": {"gpu1": ["10.0.0.1"], "gpu2": "error: [Errno -2] Name or service not known"},
    "nccl_env": {"NCCL_DEBUG": "INFO"},
    "main_listen": {"port": 29500, "free": True, "error": None,
                    "peers": [{"hostname": "gpu2", "address": "10.0.0.2"}],
                    "hostnames": {"gpu1": ["10.0.0.1"], "gpu2": "error: not known"}},
}  # fmt: skip


def test_parse_facts_reads_every_field() -> None:
    facts = parse_facts("gpu1", json.dumps(SAMPLE).encode())
    assert facts.node == "gpu1" and facts.python_found
    assert facts.packages["torch"] == "2.3.1+cu121" and facts.packages["transformers"] is None
    assert facts.torch_cuda == "12.1"
    assert facts.gpu_count == 1 and facts.gpu_model == "NVIDIA H100" and facts.driver == "550.54"
    assert facts.gpu_busy_pids == ("777",)
    assert facts.disk_free_bytes == 123 and facts.workdir_exists
    assert facts.script_sha256 == "ff"
    assert facts.interfaces == {"lo": ("127.0.0.1",), "ib0": ("10.1.0.1",)}
    assert facts.ib_devices == ("mlx5_0",)
    assert facts.resolved == {"gpu1": ("10.0.0.1",)}
    assert facts.resolve_errors == {"gpu2": "[Errno -2] Name or service not known"}
    assert facts.port == 29500 and facts.port_free is True
    assert facts.peers == (("gpu2", "10.0.0.2"),)
    assert facts.hostnames == {"gpu1": ("10.0.0.1",), "gpu2": "not known"}
    assert facts.main_reached is None


@pytest.mark.parametrize("output", [b"", b"bash: python: command not found", b"[1, 2]", b"{}"])
def test_parse_facts_rejects_what_is_not_a_probe_document(output: bytes) -> None:
    with pytest.raises(ProbeError):
        parse_facts("n1", output)


@pytest.mark.process
def test_probe_runs_locally_and_reads_metadata_without_importing_torch(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    command = probe_command(
        sys.executable, workdir=str(tmp_path), script=str(script), names=["localhost"]
    )
    done = subprocess.run(["sh", "-c", command], capture_output=True, timeout=60, check=True)
    facts = parse_facts("local", done.stdout)
    assert facts.python_found and facts.python_executable == sys.executable
    assert facts.packages["accelerate"] == metadata.version("accelerate")
    assert facts.packages["torch"] == metadata.version("torch")
    # The whole environment: every distribution but orch's own, by its normalized name.
    env = facts.environment
    assert env is not None and len(env.fingerprint) == 16
    everything = {d.metadata["Name"].lower().replace("_", "-"): d.version
                  for d in metadata.distributions() if d.metadata["Name"] != "orch"}  # fmt: skip
    assert env.dists == everything
    assert env.python_version == platform.python_version() and env.machine == platform.machine()
    assert facts.script_sha256 == hashlib.sha256(script.read_bytes()).hexdigest()
    assert facts.workdir_exists and facts.disk_free_bytes and facts.disk_free_bytes > 0
    assert "lo" in facts.interfaces and "127.0.0.1" in facts.interfaces["lo"]
    assert facts.resolved["localhost"]
    # py-spy is installed beside this interpreter; this machine runs as root.
    assert facts.stacks_probed and facts.py_spy == str(Path(sys.executable).with_name("py-spy"))
    assert facts.root is (os.geteuid() == 0)
    # The user's own directory is usable here, where a launch needs it.
    runs = f"/tmp/orch-{os.getuid()}/runs"
    assert [(d.what, d.path, d.problem) for d in facts.own_dirs] == [
        ("runs", runs, None), ("ports", f"/tmp/orch-{os.getuid()}/ports", None)
    ]
    assert not [p for p in Path(runs).iterdir() if p.name.startswith(".orch-doctor-")]


def test_every_part_of_the_probe_is_loaded_after_the_parts_it_imports() -> None:
    assert not_loaded_before(PROBE_PARTS, "probe") == []


@pytest.mark.process
def test_probe_does_not_import_torch() -> None:
    check = (
        "import sys, orchestrator.remote.probe as p; "
        "facts = p.probe({'names': []}); "
        "print(facts['packages']['torch'], 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == [metadata.version("torch"), "False"]


@pytest.mark.process
def test_missing_interpreter_falls_back_and_says_so(tmp_path: Path) -> None:
    command = probe_command(
        str(tmp_path / "no-such-python"), workdir=str(tmp_path / "gone"), script=None, names=[]
    )
    done = subprocess.run(["sh", "-c", command], capture_output=True, timeout=60, check=True)
    facts = parse_facts("local", done.stdout)
    assert not facts.python_found
    assert facts.python_requested == str(tmp_path / "no-such-python")
    assert not facts.workdir_exists
    assert facts.packages == {}


@pytest.mark.sandbox
def test_probe_on_nodes_with_the_main_port_test(sandbox) -> None:
    _, state = sandbox
    names = [n.name for n in state.nodes]
    with socket.socket() as s:  # a port free right now
        s.bind((state.nodes[0].address, 0))
        port = s.getsockname()[1]
    probes = probe_nodes(
        names, python=sys.executable, workdir=str(Path.cwd()), script=None,
        main_address=names[0], main_port=port, timeout=20,
    )  # fmt: skip
    facts = [p.facts for p in probes]
    assert all(f is not None for f in facts), [p.error for p in probes]
    main = facts[0]
    assert main.port == port and main.port_free is True
    assert all(f.main_reached for f in facts[1:]), [f.main_error for f in facts[1:]]
    if state.namespaces:
        assert [f.hostname for f in facts] == names
        assert sorted(h for h, _ in main.peers) == sorted(names[1:])
        for node in state.nodes:  # every node resolves every node to its address
            assert all(f.resolved[node.name] == (node.address,) for f in facts)
        assert main.hostnames[names[2]] == (state.nodes[2].address,)
    # Node 0 let the port go when it was done: the next job can have it.
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("0.0.0.0", port))


@pytest.mark.process
def test_listener_stops_when_stdin_closes(tmp_path: Path) -> None:
    """If the head goes away, node 0 frees the main port at once, not after its window."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = probe_command(
        sys.executable, workdir=str(tmp_path), script=None, names=[],
        main=listen_request(port, peers=3, window=120),
    )  # fmt: skip
    done = subprocess.run(
        ["sh", "-c", command], stdin=subprocess.DEVNULL, capture_output=True, timeout=60
    )
    first, facts_line = done.stdout.decode().strip().splitlines()
    assert json.loads(first) == {"listening": True, "error": None}
    facts = parse_facts("local", facts_line.encode())
    assert facts.port_free is True and facts.peers == ()


def test_the_probe_says_where_and_why_the_users_directory_cannot_be_used(tmp_path, monkeypatch):
    from orchestrator.remote import owned
    from orchestrator.remote import probe as remote_probe

    mine = tmp_path / f"orch-{os.getuid()}"
    monkeypatch.setattr(owned, "NODE_BASE", str(tmp_path))  # the node's /tmp, standing in
    mine.mkdir(mode=0o700)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (mine / "ports").symlink_to(theirs)  # planted by another user, say
    runs, ports = remote_probe.own_directories()
    assert runs == {"what": "runs", "path": str(mine / "runs")}
    assert ports["path"] == str(mine / "ports") and "symbolic link" in ports["problem"]
    assert f"rm -rf -- {mine / 'ports'}" in ports["fix"]
    assert list(theirs.iterdir()) == []
    doc = {**SAMPLE, "own_dirs": [runs, ports]}
    [bad] = [d for d in parse_facts("n1", json.dumps(doc)).own_dirs if d.problem]
    assert bad.what == "ports" and bad.fix == ports["fix"]
