"""`orch doctor` on real sandbox nodes, with real faults injected.

Faults that would disturb other tests (a key refused, a host key changed, an
sshd stopped, a node frozen) live in a private sandbox; the rest use the shared
one. Every case runs the real CLI and checks what a user sees: the exit code,
the finding for the right node, and that it came within the timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from launch_support import wait_for

from orchestrator.sandbox.cluster import Sandbox
from orchestrator.sandbox.state import SandboxState

pytestmark = pytest.mark.sandbox

ORCH = str(Path(sys.executable).with_name("orch"))
TIMEOUT = 10.0


# Doctor reports how long it took (CLI start-up aside): a node that hangs or refuses may
# use the whole timeout, and is given up on after it, whatever the load of the machine
# (the probes of the healthy nodes may take longer than the timeout then: hence the
# margin). Without the timeout, such a node holds doctor for minutes. Healthy runs are not
# timed here: their speed is bench/bench_preflight.py's.
LIMIT = TIMEOUT * 4
# The wall clock only guards against a hang of the whole command.
HANG = 300


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def write_hostfile(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / f"hostfile-{uuid.uuid4().hex[:6]}"
    path.write_text("".join(f"{name} slots=1\n" for name in names))
    return path


def doctor(
    hostfile: Path, *extra: str, port: int | None = None, as_json: bool = True
) -> tuple[int, dict | str, float]:
    """Exit code, the JSON report (or the text output), and doctor's own seconds."""
    argv = [ORCH, "doctor", "--hostfile", str(hostfile), "--timeout", str(TIMEOUT), *extra]
    if port is not None:
        argv += ["--main-port", str(port)]
    if as_json:
        argv.append("--json")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=HANG, check=False)
    if as_json and done.stdout.strip():
        report = json.loads(done.stdout)
        return done.returncode, report, report["seconds"]
    took = re.search(r" in (\d+\.\d)s$", done.stdout.strip())
    seconds = float(took.group(1)) if took else float("nan")
    return done.returncode, done.stdout + done.stderr, seconds


def findings_for(report: dict, node: str) -> list[dict]:
    return [f for f in report["findings"] if f["node"] == node]


def node_checks(report: dict, node: str) -> dict[str, str]:
    return next(n["checks"] for n in report["nodes"] if n["node"] == node)


# ----- faults -----------------------------------------------------------------------------
def _sshd_listener(box: Sandbox, name: str) -> int:
    for pid in box.node_pids(name):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        # sshd retitles itself "sshd: /usr/sbin/sshd -D -e -f ... [listener] ..."
        if b"sshd" in cmdline and b"-D" in cmdline.replace(b"\0", b" ").split():
            return pid
    raise AssertionError(f"no listening sshd found for {name}")


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_port(address: str, port: int, open_: bool) -> None:
    assert wait_for(lambda: _port_open(address, port) == open_, 10), (
        f"{address}:{port} did not become {'open' if open_ else 'closed'}"
    )


def refuse_key(box: Sandbox, state: SandboxState, name: str) -> None:
    """Point the node's sshd at an empty authorized_keys, then make it reload."""
    node_dir = Path(state.directory) / "nodes" / name
    empty = node_dir / "no_authorized_keys"
    empty.write_text("")
    config = node_dir / "sshd_config"
    lines = [
        f"AuthorizedKeysFile {empty}" if line.startswith("AuthorizedKeysFile") else line
        for line in config.read_text().splitlines()
    ]
    config.write_text("\n".join(lines) + "\n")
    os.kill(_sshd_listener(box, name), signal.SIGHUP)  # sshd re-executes itself
    node = state.node(name)
    # Until the re-executed sshd reads its new config.
    assert wait_for(lambda: not _key_accepted(name), 30, 0.2), (
        f"{name}'s sshd still accepts the key"
    )
    _wait_port(node.address, node.port, open_=True)


def _key_accepted(name: str) -> bool:
    login = subprocess.run(["ssh", "-o", "BatchMode=yes", name, "true"], capture_output=True,
                           timeout=30, check=False)  # fmt: skip
    return login.returncode == 0


def change_host_key(state: SandboxState, name: str) -> None:
    """What a reinstalled machine (or an attacker) looks like from known_hosts."""
    path = Path(state.known_hosts)
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
    lines = []
    for line in path.read_text().splitlines():
        hosts = line.split()[0].split(",")
        if name in hosts or any(h.startswith(f"[{name}]:") for h in hosts):
            line = " ".join([*line.split()[:2], other])
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")


REVOKING_FILE = "ssh_known_hosts"  # the sandbox's stand-in for /etc/ssh/ssh_known_hosts


def revoke_host_key(state: SandboxState, name: str) -> None:
    """The administrator revokes the node's key in a machine-wide file; the user's own
    known_hosts still lists it (as OpenSSH, orch must refuse the node all the same)."""
    keys = [line.split()[1:3] for line in Path(state.known_hosts).read_text().splitlines()
            if _names(line, name)]  # fmt: skip
    machine_wide = Path(state.directory) / REVOKING_FILE
    revoked = "".join(f"@revoked * {keytype} {key}\n" for keytype, key in keys)
    machine_wide.write_text(f"# {name} was compromised\n{revoked}")
    config = Path(state.ssh_config)
    text = config.read_text()
    # The node's block: `Host <name>`, or `Host <name> <address>` (a hostfile may use either).
    block = re.search(rf"^Host {re.escape(name)}(?: \S+)*\n", text, re.M)
    assert keys and block is not None, text
    config.write_text(text.replace(block.group(0),
                                   f"{block.group(0)}    GlobalKnownHostsFile {machine_wide}\n", 1))


def _names(known_hosts_line: str, name: str) -> bool:
    hosts = known_hosts_line.split()[0].split(",")
    return any(h == name or h.startswith(f"[{name}]:") for h in hosts)


def stop_sshd(box: Sandbox, state: SandboxState, name: str) -> None:
    for pid in box.node_pids(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    node = state.node(name)
    _wait_port(node.address, node.port, open_=False)


@pytest.fixture(scope="module")
def faulty(sandbox_factory) -> Iterator[tuple[SandboxState, dict[str, str]]]:
    """Six nodes: one healthy, then one per SSH fault."""
    box, state = sandbox_factory(6, 1)
    good, refused, changed, stopped, frozen, revoked = (n.name for n in state.nodes)
    refuse_key(box, state, refused)
    change_host_key(state, changed)
    revoke_host_key(state, revoked)
    stop_sshd(box, state, stopped)
    box.freeze(frozen)
    roles = {"good": good, "auth": refused, "hostkey": changed, "stopped": stopped,
             "frozen": frozen, "revoked": revoked}  # fmt: skip
    try:
        yield state, roles
    finally:
        box.thaw(frozen)


@pytest.mark.parametrize(
    ("role", "kind_text"),
    [
        ("auth", "authentication rejected"),
        ("hostkey", "HOST KEY CHANGED"),
        ("stopped", "connection refused"),
        ("frozen", "timed out"),
        ("revoked", "is REVOKED"),
    ],
)
def test_ssh_fault_on_one_node(faulty, tmp_path: Path, role: str, kind_text: str) -> None:
    state, roles = faulty
    good, bad = roles["good"], roles[role]
    hostfile = write_hostfile(tmp_path, [good, bad])
    code, report, elapsed = doctor(hostfile, port=free_port(state.nodes[0].address))
    assert code == 1
    assert isinstance(report, dict) and report["ok"] is False
    [finding] = findings_for(report, bad)
    assert finding["check"] == "ssh" and finding["severity"] == "error"
    assert kind_text in finding["problem"]
    assert finding["fix"]
    assert node_checks(report, bad)["ssh"] == "error"
    assert set(node_checks(report, good).values()) == {"ok"}, findings_for(report, good)
    assert elapsed < LIMIT


def test_revoked_host_key_refuses_the_node_though_known_hosts_lists_it(
    faulty, tmp_path: Path
) -> None:
    state, roles = faulty
    hostfile = write_hostfile(tmp_path, [roles["revoked"]])
    code, report, _ = doctor(hostfile, port=free_port(state.nodes[0].address))
    assert code == 1 and isinstance(report, dict)
    [finding] = findings_for(report, roles["revoked"])
    assert finding["check"] == "ssh" and finding["severity"] == "error"
    problem = finding["problem"]
    assert f"{Path(state.directory) / REVOKING_FILE}:2 marks it @revoked" in problem
    assert f"{state.known_hosts}:" in problem  # the user's line that still lists the key
    assert re.search(r"ssh-ed25519 SHA256:[A-Za-z0-9+/]{43} ", problem), problem
    assert "new host key" in finding["fix"] and "ssh-keygen -R" in finding["fix"]


def test_every_fault_at_once_each_named_none_hiding_another(faulty, tmp_path: Path) -> None:
    state, _ = faulty
    names = [n.name for n in state.nodes]
    hostfile = write_hostfile(tmp_path, names)
    code, report, elapsed = doctor(hostfile, port=free_port(state.nodes[0].address), as_json=False)
    assert code == 1
    assert isinstance(report, str)
    for text in ("authentication rejected", "HOST KEY CHANGED", "connection refused",
                 "timed out", "ssh-copy-id", "ssh-keygen -R", "is REVOKED"):  # fmt: skip
        assert text in report, text
    for name in names:
        assert name in report
    assert elapsed < LIMIT


def test_excluded_node_is_left_out_of_every_check(faulty, tmp_path: Path) -> None:
    state, roles = faulty
    hostfile = write_hostfile(tmp_path, [roles["good"], roles["frozen"]])
    port = free_port(state.nodes[0].address)
    code, report, _ = doctor(hostfile, "--exclude", roles["frozen"], port=port)
    assert code == 0, report
    assert isinstance(report, dict)
    assert [n["node"] for n in report["nodes"]] == [roles["good"]]


def test_auth_failure_never_prompts(faulty, tmp_path: Path) -> None:
    _, roles = faulty
    hostfile = write_hostfile(tmp_path, [roles["auth"]])
    # stdin is a terminal-less pipe that never answers: a prompt would hang here.
    argv = [ORCH, "doctor", "--hostfile", str(hostfile), "--timeout", str(TIMEOUT), "--json"]
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 1
    assert "no password is ever tried" in json.loads(out)["findings"][0]["problem"]


# ----- the shared sandbox -------------------------------------------------------------------
def test_all_nodes_pass(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    hostfile = Path(state.hostfile)
    port = free_port(state.nodes[0].address)
    code, text, _elapsed = doctor(hostfile, port=port, as_json=False)
    assert code == 0, text
    assert isinstance(text, str)
    assert f"all checks passed on {len(state.nodes)} node(s)" in text
    for node in state.nodes:
        assert node.name in text
    code, report, _ = doctor(hostfile, port=free_port(state.nodes[0].address))
    assert code == 0 and isinstance(report, dict)
    assert report["ok"] is True and report["findings"] == []
    assert [n["node"] for n in report["nodes"]] == [n.name for n in state.nodes]
    assert all(n["facts"]["packages"]["accelerate"] for n in report["nodes"])


def test_name_that_does_not_resolve(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    ghost = f"ghost-{uuid.uuid4().hex[:6]}.invalid"
    hostfile = write_hostfile(tmp_path, [n.name for n in state.nodes] + [ghost])
    code, report, _elapsed = doctor(hostfile, port=free_port(state.nodes[0].address))
    assert code == 1 and isinstance(report, dict)
    [finding] = findings_for(report, ghost)
    assert finding["check"] == "ssh"
    assert f"host name '{ghost}' does not resolve" in finding["problem"]
    assert "/etc/hosts" in finding["fix"]
    # The others are still checked, and say they cannot resolve the name either.
    assert node_checks(report, state.nodes[1].name)["python"] == "ok"


def _dist_info(site: Path, name: str, version: str) -> None:
    dist = site / f"{name}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def wrapped_python(sandbox, tmp_path: Path) -> tuple[str, str, str]:
    """An interpreter whose environment differs on two nodes, each by its own PYTHONPATH:
    accelerate's metadata says 0.0.1 on one, and another has a package nobody else has."""
    _, state = sandbox
    odd, extra = state.nodes[2].name, state.nodes[3].name
    _dist_info(tmp_path / "odd-site", "accelerate", "0.0.1")
    _dist_info(tmp_path / "extra-site", "left_over", "0.1")
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$ORCH_SANDBOX_NODE" in {odd}) export PYTHONPATH={tmp_path / "odd-site"};; '
        f'{extra}) export PYTHONPATH={tmp_path / "extra-site"};; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper), odd, extra


def _parity_finding(report: dict, node: str) -> dict:
    """The node's one parity finding; beside it, on a loaded machine, at most a warning that
    the node's shell started slowly."""
    [finding] = [f for f in findings_for(report, node) if f["check"] == "parity"]
    others = [f for f in findings_for(report, node) if f["check"] != "parity"]
    assert all((f["check"], f["severity"]) == ("shell", "warning") for f in others), others
    return finding


def test_different_environment_on_two_nodes(sandbox, wrapped_python, tmp_path: Path) -> None:
    """The head (which runs the same interpreter path) is the reference; every difference
    is named by package, the launcher's first, and the node that has it."""
    _, state = sandbox
    python, odd, extra = wrapped_python
    hostfile = Path(state.hostfile)
    port = free_port(state.nodes[0].address)
    code, report, _elapsed = doctor(hostfile, "--python", python, port=port)
    assert code == 1 and isinstance(report, dict)
    version = metadata.version("accelerate")
    env = report["environment"]
    assert env["reference"] == "the head"
    assert env["differences"] == [
        {"package": "accelerate", "kind": "launcher", "severity": "error", "reference": version,
         "others": [{"value": "0.0.1", "nodes": [odd]}]},
        {"package": "left-over", "kind": "other", "severity": "warning", "reference": None,
         "others": [{"value": "0.1", "nodes": [extra]}]},
    ]  # fmt: skip
    prints = env["fingerprints"]
    assert len({prints["the head"], prints[odd], prints[extra]}) == 3
    assert prints[state.nodes[0].name] == prints[state.nodes[1].name] == prints["the head"]
    finding = _parity_finding(report, odd)
    assert finding["severity"] == "error"
    assert f"accelerate 0.0.1 ({version} on the head)" in finding["problem"]
    assert f"pip install accelerate=={version}" in finding["fix"]
    finding = _parity_finding(report, extra)
    assert finding["severity"] == "warning" and "pip uninstall -y left-over" in finding["fix"]
    code, text, _ = doctor(hostfile, "--python", python, port=port, as_json=False)
    assert code == 1 and isinstance(text, str)
    assert f"0.0.1 on {odd}; {version} elsewhere" in text
    assert f"0.1 on {extra}; missing elsewhere" in text


def test_a_slow_node_is_not_a_dead_one(sandbox, tmp_path: Path) -> None:
    """A node whose Python takes longer to start than the connect timeout (a cold NFS
    mount) answered: its probe gets its own, longer limit, and doctor passes."""
    _, state = sandbox
    slow = state.nodes[1].name
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$ORCH_SANDBOX_NODE" = "{slow}" ]; then sleep {TIMEOUT + 3}; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    hostfile = Path(state.hostfile)
    code, report, elapsed = doctor(hostfile, "--python", str(wrapper),
                                   port=free_port(state.nodes[0].address))  # fmt: skip
    assert code == 0, findings_for(report, slow) if isinstance(report, dict) else report
    assert elapsed > TIMEOUT + 3  # it did wait for the slow node
    code, report, _ = doctor(hostfile, "--python", str(wrapper), "--probe-timeout", "1",
                             port=free_port(state.nodes[0].address))  # fmt: skip
    assert code == 1 and isinstance(report, dict)
    [finding] = findings_for(report, slow)
    assert "did not finish" in finding["problem"], finding


def test_main_port_in_use_on_node_zero(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    main = state.nodes[0]
    with socket.socket() as holder:
        holder.bind((main.address, 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        code, report, _elapsed = doctor(Path(state.hostfile), port=port)
    assert code == 1 and isinstance(report, dict)
    [finding] = findings_for(report, main.name)
    assert finding["check"] == "network"
    assert f"main port {port} is already in use on {main.name}" in finding["problem"]
    assert "--main-port" in finding["fix"]


def test_bad_hostfile_is_a_usage_error_with_file_and_line(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("good slots=2\nbad slots=two\n")
    code, text, _ = doctor(hostfile, as_json=False)
    assert code == 2
    assert isinstance(text, str) and f"{hostfile}:2" in text


@pytest.mark.slow
def test_deep_all_reduce_across_nodes(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    hostfile = write_hostfile(tmp_path, [n.name for n in state.nodes[:2]])
    code, report, _ = doctor(hostfile, "--deep", port=free_port(state.nodes[0].address))
    assert code == 0, report
    assert isinstance(report, dict)
    deep = report["deep"]
    assert [r["node"] for r in deep] == [n.name for n in state.nodes[:2]]
    assert all(r["ok"] and r["backend"] == "gloo" and r["bus_bandwidth_mbps"] > 0 for r in deep)


def test_accelerate_config_without_deepspeed_hostfile(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    config = tmp_path / "accelerate.yaml"
    config.write_text(
        "distributed_type: DEEPSPEED\nnum_machines: 2\n"
        "deepspeed_config:\n  deepspeed_multinode_launcher: pdsh\n  zero_stage: 2\n"
    )
    hostfile = write_hostfile(tmp_path, [n.name for n in state.nodes[:2]])
    port = free_port(state.nodes[0].address)
    code, report, _ = doctor(hostfile, "--accelerate-config", str(config), port=port)
    assert code == 1 and isinstance(report, dict)
    [finding] = report["findings"]
    assert finding["node"] == "*"
    assert f"{config}: deepspeed_hostfile is unset" in finding["problem"]
    config.write_text("distributed_type: [DEEPSPEED\n")
    code, text, _ = doctor(hostfile, "--accelerate-config", str(config), as_json=False)
    assert code == 2 and isinstance(text, str) and f"{config}:" in text
