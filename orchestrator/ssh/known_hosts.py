"""known_hosts with OpenSSH's rules (hashed entries, `[host]:port`, patterns, @revoked) and
the verdict on a host key: a key is never accepted silently."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from orchestrator.ssh.config import SSHTarget
from orchestrator.ssh.errors import ssh_error


# ----- known_hosts, with OpenSSH's matching rules --------------------------------
@dataclass(frozen=True)
class KnownHostEntry:
    marker: str | None  # None, "@revoked" or "@cert-authority"
    patterns: tuple[str, ...]
    keytype: str
    key_base64: str
    source: str
    line: int


def parse_known_hosts(text: str, source: str = "<known_hosts>") -> list[KnownHostEntry]:
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        marker = None
        if fields[0].startswith("@"):
            marker, fields = fields[0], fields[1:]
        if len(fields) < 3:
            continue
        entries.append(
            KnownHostEntry(
                marker, tuple(fields[0].split(",")), fields[1], fields[2], source, number
            )
        )
    return entries


def _hashed_match(pattern: str, name: str) -> bool:
    # |1|base64(salt)|base64(HMAC-SHA1(salt, name))
    try:
        _, _, salt_b64, digest_b64 = pattern.split("|")
        salt, digest = base64.b64decode(salt_b64), base64.b64decode(digest_b64)
    except ValueError:
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)


def _wildcard_match(pattern: str, name: str) -> bool:
    # OpenSSH patterns know only `*` and `?`; `[` is literal (as in `[host]:port`).
    regex = "".join(
        ".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower()
    )
    return re.fullmatch(regex, name.lower()) is not None


def host_matches(patterns: Sequence[str], name: str) -> bool:
    """OpenSSH host list: any positive match and no negated match."""
    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        match = _hashed_match if body.startswith("|1|") else _wildcard_match
        hit = match(body, name)
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def _keytype_family(keytype: str) -> str:
    # Server signature algorithms for one RSA key differ in name from its key type.
    return "ssh-rsa" if keytype in ("ssh-rsa", "rsa-sha2-256", "rsa-sha2-512") else keytype


@dataclass(frozen=True)
class HostKeyVerdict:
    status: str  # "known" | "unknown" | "changed" | "revoked" | "other-type"
    entry: KnownHostEntry | None = None
    known_types: tuple[str, ...] = ()


def check_host_key(
    entries: Sequence[KnownHostEntry], name: str, keytype: str, key_base64: str
) -> HostKeyVerdict:
    """Decide as OpenSSH does whether a server key is trusted for `name`."""
    family = _keytype_family(keytype)
    same_type: list[KnownHostEntry] = []
    other_types: set[str] = set()
    for entry in entries:
        if entry.marker == "@cert-authority" or not host_matches(entry.patterns, name):
            continue
        if entry.marker == "@revoked":
            if entry.key_base64 == key_base64:
                return HostKeyVerdict("revoked", entry)
            continue
        if _keytype_family(entry.keytype) == family:
            if entry.key_base64 == key_base64:
                return HostKeyVerdict("known", entry)
            same_type.append(entry)
        else:
            other_types.add(entry.keytype)
    if same_type:
        return HostKeyVerdict("changed", same_type[0], tuple(sorted(other_types)))
    if other_types:
        return HostKeyVerdict("other-type", None, tuple(sorted(other_types)))
    return HostKeyVerdict("unknown")


def load_known_hosts(files: Sequence[str]) -> list[KnownHostEntry]:
    entries: list[KnownHostEntry] = []
    for path in files:
        with contextlib.suppress(OSError):
            entries.extend(parse_known_hosts(Path(path).read_text(), path))
    return entries


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


_known_hosts_lock = threading.Lock()


def _record_host_key(path: str, name: str, key: paramiko.PKey) -> None:
    Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _known_hosts_lock, open(path, "a") as handle:
        handle.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def preferred_host_key_types(entries: Sequence[KnownHostEntry], name: str) -> list[str]:
    types: list[str] = []
    for entry in entries:
        if entry.marker is None and host_matches(entry.patterns, name):
            if _keytype_family(entry.keytype) == "ssh-rsa":
                types += ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]
            else:
                types.append(entry.keytype)
    return list(dict.fromkeys(types))


def verify_host_key(target: SSHTarget, key: paramiko.PKey) -> None:
    name = target.host_key_name
    entries = load_known_hosts(target.known_hosts_files)
    verdict = check_host_key(entries, name, key.get_name(), key.get_base64())
    fp = f"{key.get_name()} {fingerprint(key)}"
    node = target.node
    if verdict.status == "known":
        return
    if verdict.status == "revoked":
        raise ssh_error(
            node,
            "hostkey-changed",
            f"{node}: host key {fp} is marked @revoked in {verdict.entry.source}",
            "the key was revoked on purpose; ask the machine's administrator",
        )
    if verdict.status == "changed":
        entry = verdict.entry
        raise ssh_error(
            node,
            "hostkey-changed",
            f"{node}: HOST KEY CHANGED for {name}: the server now presents {fp}, "
            f"which differs from {entry.source}:{entry.line}; this may be an attack "
            "(someone intercepting the connection)",
            f"if the machine was reinstalled and you verified the new fingerprint out of band, "
            f"run `ssh-keygen -R '{name}' -f {entry.source}` and connect again",
        )
    if target.strict == "accept-new" and verdict.status == "unknown" and target.known_hosts_files:
        _record_host_key(target.known_hosts_files[0], name, key)
        return
    files = ", ".join(target.known_hosts_files) or "no known_hosts file"
    extra = (
        f" (keys of another type are known: {', '.join(verdict.known_types)})"
        if verdict.status == "other-type"
        else ""
    )
    raise ssh_error(
        node,
        "hostkey-unknown",
        f"{node}: host key for {name} is not known ({fp}){extra}; searched {files}",
        f"check the fingerprint with the machine's administrator (on the node: "
        f"`ssh-keygen -lf /etc/ssh/ssh_host_{key.get_name().removeprefix('ssh-')}_key.pub`), "
        f"then add it: `ssh-keyscan -p {target.port} {target.hostname} >> ~/.ssh/known_hosts`, "
        "or pass --accept-new-host-keys to record keys never seen before",
    )
