"""Host keys across every known_hosts file ssh_config names: a key marked @revoked in any
of them refuses the node, as OpenSSH does, even where another file lists the key; markers
other than @revoked and @cert-authority are no entries at all; an authority never vouches
for a key on its own."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from orchestrator.ssh import (
    SSHError,
    check_host_key,
    load_ssh_config,
    parse_known_hosts,
    resolve_target,
)
from orchestrator.ssh.config import SSHTarget
from orchestrator.ssh.known_hosts import certificate_signer, verify_host_key

ED25519 = "ssh-ed25519"


def ed25519_blob() -> bytes:
    raw = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    message = paramiko.Message()
    message.add_string(ED25519)
    message.add_string(raw)
    return message.asbytes()


def b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


def sha256(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def certificate(host_blob: bytes, ca_blob: bytes) -> bytes:
    """An OpenSSH host certificate for the key (PROTOCOL.certkeys); its signature is never
    checked here, only who signed it."""
    host = paramiko.Message(host_blob)
    host.get_text()  # its type
    message = paramiko.Message()
    message.add_string(ED25519 + "-cert-v01@openssh.com")
    message.add_string(b"nonce" * 6)
    message.add_string(host.get_binary())  # the certified key
    message.add_int64(7)  # serial
    message.add_int(2)  # a host certificate
    message.add_string("node1 host key")
    message.add_string(b"")  # principals
    message.add_int64(0)
    message.add_int64(2**64 - 1)
    for _ in range(3):  # critical options, extensions, reserved
        message.add_string(b"")
    message.add_string(ca_blob)
    message.add_string(b"signature")
    return message.asbytes()


def target_with(tmp_path: Path, user_lines: str, global_lines: str) -> SSHTarget:
    user, machine = tmp_path / "known_hosts", tmp_path / "ssh_known_hosts"
    user.write_text(user_lines)
    machine.write_text(global_lines)
    config = tmp_path / "config"
    config.write_text(
        f"Host node1\n  HostName 10.1.2.3\n  UserKnownHostsFile {user}\n"
        f"  GlobalKnownHostsFile {machine}\n"
    )
    target = resolve_target("node1", load_ssh_config(config))
    assert target.known_hosts_files == (str(user), str(machine))
    return target


# ----- @revoked wins over every other line, whichever file it is in --------------------
def test_revoked_in_the_global_file_outweighs_the_users_own_line(tmp_path: Path) -> None:
    blob = ed25519_blob()
    key = paramiko.Ed25519Key(data=blob)
    target = target_with(
        tmp_path,
        f"10.1.2.3 {ED25519} {b64(blob)}\n",
        f"# compromised on 2024-05-02\n@revoked * {ED25519} {b64(blob)}\n",
    )
    with pytest.raises(SSHError) as err:
        verify_host_key(target, key)
    failure = err.value.failure
    assert failure.kind == "hostkey-revoked"
    assert f"{ED25519} {sha256(blob)}" in failure.message
    assert f"{tmp_path / 'ssh_known_hosts'}:2" in failure.message
    assert "REVOKED" in failure.message and "node1" in failure.message
    assert f"{tmp_path / 'known_hosts'}:1" in failure.message  # the line that still lists it
    assert "new host key" in failure.hint
    assert f"ssh-keygen -R '10.1.2.3' -f {tmp_path / 'known_hosts'}" in failure.hint


def test_revoked_key_is_refused_with_accept_new_and_never_recorded(tmp_path: Path) -> None:
    blob = ed25519_blob()
    target = target_with(tmp_path, "", f"@revoked 10.1.2.3 {ED25519} {b64(blob)}\n")
    accept_new = SSHTarget(**{**target.__dict__, "strict": "accept-new"})
    with pytest.raises(SSHError) as err:
        verify_host_key(accept_new, paramiko.Ed25519Key(data=blob))
    assert err.value.failure.kind == "hostkey-revoked"
    assert "ssh-keygen -R" not in err.value.failure.hint  # no file lists it
    assert (tmp_path / "known_hosts").read_text() == ""


def test_verdict_is_the_same_whatever_the_order_of_the_lines() -> None:
    blob = ed25519_blob()
    listed = f"node1 {ED25519} {b64(blob)}\n"
    revoked = f"@revoked node* {ED25519} {b64(blob)}\n"
    for text in (listed + revoked, revoked + listed):
        verdict = check_host_key(parse_known_hosts(text), "node1", ED25519, b64(blob))
        assert verdict.status == "revoked"
        assert verdict.entry is not None and verdict.entry.marker == "@revoked"
        assert verdict.listed_by is not None and verdict.listed_by.marker is None
    # A @revoked line for other hosts leaves this one alone, as in OpenSSH.
    other = f"@revoked gpu* {ED25519} {b64(blob)}\n" + listed
    assert check_host_key(parse_known_hosts(other), "node1", ED25519, b64(blob)).status == "known"


def test_unknown_marker_is_no_entry() -> None:
    # OpenSSH's markers are case-sensitive and it skips a line whose marker it does not know.
    blob = b64(ed25519_blob())
    for marker in ("@Revoked", "@revoke", "@cert-auth"):
        entries = parse_known_hosts(f"{marker} node1 {ED25519} {blob}\n")
        assert entries == []
        assert check_host_key(entries, "node1", ED25519, blob).status == "unknown"


# ----- @cert-authority -------------------------------------------------------------------
def test_cert_authority_line_never_vouches_for_a_key_itself() -> None:
    host, other = b64(ed25519_blob()), b64(ed25519_blob())
    entries = parse_known_hosts(f"@cert-authority node* {ED25519} {host}\n")
    assert check_host_key(entries, "node1", ED25519, host).status == "unknown"
    # ...nor makes a key look changed, and a plain line next to it still counts.
    both = parse_known_hosts(f"@cert-authority * {ED25519} {other}\nnode1 {ED25519} {host}\n")
    assert check_host_key(both, "node1", ED25519, host).status == "known"


def test_host_certificate_signed_by_a_revoked_authority_is_refused(tmp_path: Path) -> None:
    host_blob, ca_blob = ed25519_blob(), ed25519_blob()
    key = paramiko.Ed25519Key(msg=paramiko.Message(certificate(host_blob, ca_blob)))
    assert key.get_base64() == b64(host_blob)
    assert certificate_signer(key) == b64(ca_blob)
    assert certificate_signer(paramiko.Ed25519Key(data=host_blob)) is None
    target = target_with(
        tmp_path,
        f"10.1.2.3 {ED25519} {b64(host_blob)}\n@cert-authority * {ED25519} {b64(ca_blob)}\n",
        f"@revoked * {ED25519} {b64(ca_blob)}\n",
    )
    with pytest.raises(SSHError) as err:
        verify_host_key(target, key)
    failure = err.value.failure
    assert failure.kind == "hostkey-revoked"
    assert "REVOKED authority" in failure.message and sha256(ca_blob) in failure.message
    assert f"{tmp_path / 'ssh_known_hosts'}:1" in failure.message
    # Without the revocation the host's own line is what trusts it.
    (tmp_path / "ssh_known_hosts").write_text("")
    verify_host_key(target, key)
