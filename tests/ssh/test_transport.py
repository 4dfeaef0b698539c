"""SSH transport: ssh_config and known_hosts rules (pure), and real sshd nodes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.ssh import (
    SSHError,
    check_host_key,
    expand_includes,
    host_matches,
    load_ssh_config,
    open_session,
    parse_known_hosts,
    resolve_target,
    run_on_nodes,
)

KEY_A = "AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
KEY_B = "AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


# ----- ssh_config ----------------------------------------------------------------
def test_include_is_expanded_with_globs_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "a.conf").write_text("Host alpha\n  HostName 127.0.0.5\n")
    (tmp_path / "conf.d" / "b.conf").write_text("Host beta\n  Port 2200\n")
    text = "Include conf.d/*.conf\nHost *\n  User someone\n"
    expanded = expand_includes(text, tmp_path)
    config_file = tmp_path / "config"
    config_file.write_text(expanded)
    config = load_ssh_config(config_file)
    alpha = resolve_target("alpha", config)
    assert (alpha.hostname, alpha.port, alpha.user) == ("127.0.0.5", 22, "someone")
    assert resolve_target("beta", config).port == 2200


def test_resolve_target_applies_ssh_config(tmp_path: Path) -> None:
    config_file = tmp_path / "config"
    config_file.write_text(
        "Host gpu*\n"
        "  HostName 127.0.0.9\n"
        "  Port 2222\n"
        "  User trainer\n"
        "  IdentityFile ~/keys/cluster\n"
        "  IdentitiesOnly yes\n"
        "  UserKnownHostsFile /tmp/kh1 /tmp/kh2\n"
        "  StrictHostKeyChecking no\n"
        "  ProxyJump bastion,jump2:2022\n"
        "  ConnectTimeout 4\n"
    )
    target = resolve_target("gpu7", load_ssh_config(config_file))
    assert (target.hostname, target.port, target.user) == ("127.0.0.9", 2222, "trainer")
    assert target.identity_files == (os.path.expanduser("~/keys/cluster"),)
    assert target.identities_only
    assert target.known_hosts_files[:2] == ("/tmp/kh1", "/tmp/kh2")
    # `no` is never honoured as "accept anything": orch stays strict.
    assert target.strict == "yes"
    assert target.proxy_jump == ("bastion", "jump2:2022")
    assert target.connect_timeout == 4.0
    assert target.host_key_name == "[127.0.0.9]:2222"
    assert resolve_target("gpu7", load_ssh_config(config_file), accept_new=True).strict == (
        "accept-new"
    )


# ----- known_hosts ----------------------------------------------------------------
def test_known_hosts_plain_bracketed_and_hashed_entries() -> None:
    entries = parse_known_hosts(
        f"node1,10.0.0.1 ssh-ed25519 {KEY_A}\n"
        f"[node2]:2222 ssh-ed25519 {KEY_A}\n"
        f"{hashed('[node3]:2222')} ssh-ed25519 {KEY_A}\n"
        "# a comment\n"
    )
    for name in ("node1", "10.0.0.1", "[node2]:2222", "[node3]:2222"):
        assert check_host_key(entries, name, "ssh-ed25519", KEY_A).status == "known", name
    assert check_host_key(entries, "node2", "ssh-ed25519", KEY_A).status == "unknown"
    assert check_host_key(entries, "[node3]:22", "ssh-ed25519", KEY_A).status == "unknown"


def test_changed_revoked_and_other_type_keys() -> None:
    entries = parse_known_hosts(
        f"node1 ssh-ed25519 {KEY_A}\n@revoked * ssh-ed25519 {KEY_B}\nnode9 ssh-rsa {KEY_A}\n"
    )
    changed = check_host_key(entries, "node1", "ssh-ed25519", "AAAAother")
    assert changed.status == "changed" and changed.entry is not None and changed.entry.line == 1
    assert check_host_key(entries, "node1", "ssh-ed25519", KEY_B).status == "revoked"
    assert check_host_key(entries, "node9", "ssh-ed25519", KEY_A).status == "other-type"
    # An RSA key signed with rsa-sha2-512 is still the ssh-rsa entry.
    assert check_host_key(entries, "node9", "rsa-sha2-512", KEY_A).status == "known"


def test_host_patterns_and_negation() -> None:
    assert host_matches(["*.cluster", "!bad.cluster"], "gpu1.cluster")
    assert not host_matches(["*.cluster", "!bad.cluster"], "bad.cluster")
    assert host_matches(["node?"], "node7")
    assert not host_matches(["node?"], "node17")
    assert host_matches(["[node*]:2222"], "[node4]:2222")
    assert not host_matches(["[node4]:2222"], "n")


@given(st.from_regex(r"[a-z][a-z0-9.-]{0,30}", fullmatch=True), st.binary(min_size=20, max_size=20))
def test_hashed_entry_matches_only_its_own_name(name: str, salt: bytes) -> None:
    entries = parse_known_hosts(f"{hashed(name, salt)} ssh-ed25519 {KEY_A}\n")
    assert check_host_key(entries, name, "ssh-ed25519", KEY_A).status == "known"
    assert check_host_key(entries, name + "x", "ssh-ed25519", KEY_A).status == "unknown"


# ----- real nodes -----------------------------------------------------------------
@pytest.mark.sandbox
def test_run_on_nodes_returns_one_result_per_node_in_order(sandbox) -> None:
    _, state = sandbox
    names = [n.name for n in state.nodes]
    outcomes = run_on_nodes(
        names, lambda node: f"echo {node}; hostname; echo err >&2; exit 3", timeout=20
    )
    assert [o.node for o in outcomes] == names
    assert outcomes.ok and outcomes.failed == ()
    for node, outcome in zip(names, outcomes, strict=True):
        result = outcome.value
        assert outcome.ok and result is not None
        assert result.exit_code == 3
        lines = result.stdout.decode().split()
        assert lines[0] == node
        if state.namespaces:
            assert lines[1] == node  # each node is its own UTS namespace
        assert result.stderr == b"err\n"


@pytest.mark.sandbox
def test_stdin_and_large_output(sandbox) -> None:
    _, state = sandbox
    node = state.nodes[0].name
    with open_session(node, timeout=10) as session:
        echoed = session.run("cat", timeout=10, stdin=b"hello\n" * 1000)
        big = session.run("head -c 3000000 /dev/zero", timeout=20)
    assert echoed.stdout == b"hello\n" * 1000
    assert len(big.stdout) == 3_000_000


@pytest.mark.sandbox
def test_command_timeout_is_enforced(sandbox) -> None:
    _, state = sandbox
    node = state.nodes[1].name
    started = time.monotonic()
    outcome = run_on_nodes([node], "sleep 60", timeout=1.5)[node]
    assert not outcome.ok and outcome.kind == "timeout"
    assert outcome.problem is not None and "did not finish within 1.5s" in outcome.problem
    assert time.monotonic() - started < 1.5 + 10
    # What the node printed on stderr before the limit says why.
    outcome = run_on_nodes([node], "echo one >&2; echo 'waiting for lock' >&2; sleep 60",
                           timeout=1.5)[node]  # fmt: skip
    assert outcome.problem == (
        f"{node}: command did not finish within 1.5s; the node printed on stderr: "
        "one | waiting for lock"
    )


def _private_config(tmp_path: Path, state, node, **overrides: str) -> Path:
    """An ssh_config for one sandbox node with its own known_hosts and identity."""
    settings = {
        "HostName": node.address,
        "Port": str(node.port),
        "User": state.user,
        "IdentityFile": state.identity,
        "IdentitiesOnly": "yes",
        "UserKnownHostsFile": str(tmp_path / "known_hosts"),
        "StrictHostKeyChecking": "yes",
    }
    settings.update(overrides)
    lines = ["Host target"] + [f"  {k} {v}" for k, v in settings.items()]
    path = tmp_path / "config"
    path.write_text("\n".join(lines) + f"\nInclude {state.ssh_config}\n")
    return path


@pytest.mark.sandbox
def test_unknown_host_key_fails_then_accept_new_records_it(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    node = state.nodes[2]
    config = load_ssh_config(_private_config(tmp_path, state, node))
    with pytest.raises(SSHError) as err:
        open_session("target", timeout=10, config=config)
    failure = err.value.failure
    assert failure.kind == "hostkey-unknown"
    assert "SHA256:" in failure.message and "ssh-keyscan" in failure.hint
    assert not (tmp_path / "known_hosts").exists()

    with open_session("target", timeout=10, config=config, accept_new_host_keys=True) as s:
        assert s.run("echo ok", timeout=10).stdout == b"ok\n"
    recorded = (tmp_path / "known_hosts").read_text()
    name = node.address if node.port == 22 else f"[{node.address}]:{node.port}"
    assert recorded.startswith(f"{name} ssh-ed25519 ")
    with open_session("target", timeout=10, config=config) as s:  # now known
        assert s.run("true", timeout=10).exit_code == 0

    # A changed key is refused even with accept-new.
    tampered = [*recorded.split()[:2], KEY_B]
    (tmp_path / "known_hosts").write_text(" ".join(tampered) + "\n")
    with pytest.raises(SSHError) as err:
        open_session("target", timeout=10, config=config, accept_new_host_keys=True)
    assert err.value.failure.kind == "hostkey-changed"
    assert "HOST KEY CHANGED" in err.value.failure.message
    assert "ssh-keygen -R" in err.value.failure.hint


@pytest.mark.sandbox
def test_key_not_authorized_fails_as_auth_without_prompting(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    node = state.nodes[0]
    key = tmp_path / "stranger"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30
    )
    (tmp_path / "known_hosts").write_text(Path(state.known_hosts).read_text())
    config = load_ssh_config(_private_config(tmp_path, state, node, IdentityFile=str(key)))
    started = time.monotonic()
    with pytest.raises(SSHError) as err:
        open_session("target", timeout=10, config=config)
    assert err.value.failure.kind == "auth"
    assert "authentication rejected" in err.value.failure.message
    assert "no password is ever tried" in err.value.failure.message
    assert "ssh-copy-id" in err.value.failure.hint
    assert time.monotonic() - started < 10


@pytest.mark.sandbox
def test_closed_port_is_refused(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    node = state.nodes[0]
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind((node.address, 0))
        free_port = probe.getsockname()[1]
    config = load_ssh_config(_private_config(tmp_path, state, node, Port=str(free_port)))
    with pytest.raises(SSHError) as err:
        open_session("target", timeout=10, config=config)
    assert err.value.failure.kind == "refused"
    assert f"{node.address}:{free_port}" in err.value.failure.message


@pytest.mark.sandbox
def test_proxy_jump_through_another_node(sandbox, tmp_path: Path) -> None:
    _, state = sandbox
    if not state.namespaces:
        pytest.skip("needs node-local /etc/hosts (namespaces)")
    jump, node = state.nodes[0], state.nodes[3]
    # Only the nodes resolve node names: the target is reachable through the jump only.
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(node.name, node.port)
    (tmp_path / "known_hosts").write_text(Path(state.known_hosts).read_text())
    config = load_ssh_config(
        _private_config(tmp_path, state, node, HostName=node.name, ProxyJump=jump.name)
    )
    with open_session("target", timeout=10, config=config) as session:
        result = session.run("hostname", timeout=10)
    assert result.stdout.decode().strip() == node.name
