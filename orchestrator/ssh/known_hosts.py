"""known_hosts with OpenSSH's rules (hashed entries, `[host]:port`, patterns, @revoked) and
the verdict on a host key: a key is never accepted silently, and a key (or the authority
that signed its certificate) marked @revoked in any of the files is refused, whatever
another file says."""

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
from orchestrator.ssh.errors import SSHError, ssh_error

# ----- known_hosts, with OpenSSH's matching rules --------------------------------
REVOKED, CERT_AUTHORITY = "@revoked", "@cert-authority"
MARKERS = (REVOKED, CERT_AUTHORITY)


@dataclass(frozen=True)
class KnownHostEntry:
    marker: str | None  # None, REVOKED or CERT_AUTHORITY
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
        # OpenSSH skips a line with a marker it does not know (they are case-sensitive):
        # taken for a plain entry, `@Revoked host key` would make that key trusted.
        if (marker is not None and marker not in MARKERS) or len(fields) < 3:
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
    entry: KnownHostEntry | None = None  # the @revoked, known or differing entry
    known_types: tuple[str, ...] = ()
    listed_by: KnownHostEntry | None = None  # for a revoked key: a plain entry listing it


def check_host_key(
    entries: Sequence[KnownHostEntry],
    name: str,
    keytype: str,
    key_base64: str,
    signer_base64: str | None = None,
) -> HostKeyVerdict:
    """Decide as OpenSSH does whether a server key is trusted for `name`. `signer_base64`
    is the key of the authority that signed the server's certificate, if it sent one.

    Revocation is looked for in every entry before any is trusted: the files are read
    user's first, so a first-match rule would let the user's own line for a key outweigh
    the administrator's @revoked for it. @cert-authority entries never vouch for a key
    themselves (orch does not accept host certificates on an authority's word)."""
    matching = [entry for entry in entries if host_matches(entry.patterns, name)]
    plain = [entry for entry in matching if entry.marker is None]
    revoked_keys = {key_base64, signer_base64} - {None}
    for entry in matching:
        if entry.marker == REVOKED and entry.key_base64 in revoked_keys:
            listed = next((e for e in plain if e.key_base64 == key_base64), None)
            return HostKeyVerdict("revoked", entry, listed_by=listed)
    family = _keytype_family(keytype)
    same_type = [entry for entry in plain if _keytype_family(entry.keytype) == family]
    other_types = tuple(sorted({entry.keytype for entry in plain} - {e.keytype for e in same_type}))
    known = next((entry for entry in same_type if entry.key_base64 == key_base64), None)
    if known is not None:
        return HostKeyVerdict("known", known)
    if same_type:
        return HostKeyVerdict("changed", same_type[0], other_types)
    if other_types:
        return HostKeyVerdict("other-type", None, other_types)
    return HostKeyVerdict("unknown")


def load_known_hosts(files: Sequence[str]) -> list[KnownHostEntry]:
    entries: list[KnownHostEntry] = []
    for path in files:
        with contextlib.suppress(OSError):
            entries.extend(parse_known_hosts(Path(path).read_text(), path))
    return entries


def fingerprint(key: paramiko.PKey) -> str:
    return _blob_fingerprint(key.asbytes())


def _blob_fingerprint(blob: bytes) -> str:
    digest = hashlib.sha256(blob).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# How many public-key fields a certificate carries between its nonce and its serial
# (PROTOCOL.certkeys), by the type of the key it certifies.
_CERTIFIED_KEY_FIELDS = {"ssh-rsa": 2, "ssh-dss": 4, "ssh-ed25519": 1,
                         "ecdsa-sha2-nistp256": 2, "ecdsa-sha2-nistp384": 2,
                         "ecdsa-sha2-nistp521": 2}  # fmt: skip
_CERT_SUFFIX = "-cert-v01@openssh.com"


def certificate_signer(key: paramiko.PKey) -> str | None:
    """The base64 key of the authority that signed the server's host certificate, or None
    when the server sent a plain key (paramiko keeps a certificate as `public_blob`)."""
    blob = getattr(key, "public_blob", None)
    if blob is None or not blob.key_type.endswith(_CERT_SUFFIX):
        return None
    fields = _CERTIFIED_KEY_FIELDS.get(blob.key_type.removesuffix(_CERT_SUFFIX))
    if fields is None:
        return None
    message = paramiko.Message(blob.key_blob)
    message.get_text()  # the certificate's type
    for _ in range(1 + fields):  # the nonce, then the key's numbers
        message.get_string()
    message.get_int64()  # serial
    message.get_int()  # certificate type
    for _ in range(2):  # key id, principals
        message.get_string()
    message.get_int64()  # valid after
    message.get_int64()  # valid before
    for _ in range(3):  # critical options, extensions, reserved
        message.get_string()
    return base64.b64encode(message.get_string()).decode()


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
    signer = certificate_signer(key)
    verdict = check_host_key(entries, name, key.get_name(), key.get_base64(), signer)
    fp = f"{key.get_name()} {fingerprint(key)}"
    node = target.node
    if verdict.status == "known":
        return
    if verdict.status == "revoked" and verdict.entry is not None:
        raise _revoked_error(target, key, verdict.entry, verdict.listed_by)
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


def _revoked_error(
    target: SSHTarget, key: paramiko.PKey, revoked: KnownHostEntry, listed_by: KnownHostEntry | None
) -> SSHError:
    """A revoked key refuses the node, as with OpenSSH, even where another file lists it."""
    node, name, where = target.node, target.host_key_name, f"{revoked.source}:{revoked.line}"
    fp = f"{key.get_name()} {fingerprint(key)}"
    if revoked.key_base64 == key.get_base64():
        what = f"host key {fp} of {name} is REVOKED: {where} marks it @revoked"
    else:
        signer = _blob_fingerprint(base64.b64decode(revoked.key_base64))
        what = (f"host key {fp} of {name} comes with a certificate signed by a REVOKED "
                f"authority ({revoked.keytype} {signer}): {where} marks it @revoked")  # fmt: skip
    listed = f" (though {listed_by.source}:{listed_by.line} lists the key)" if listed_by else ""
    forget = (
        f"remove the old line (`ssh-keygen -R '{name}' -f {listed_by.source}`), then "
        if listed_by
        else ""
    )
    return ssh_error(
        node,
        "hostkey-revoked",
        f"{node}: {what}{listed}; OpenSSH refuses this node, and so does orch",
        "a revoked key must never be trusted again (it leaked, or the node was compromised): "
        "leave the node out until its administrator gives it a new host key; "
        f"{forget}record the new key once you have checked its fingerprint with them",
    )
