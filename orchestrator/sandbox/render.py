"""The files a sandbox is made of: keys, known_hosts, ssh_config, hostfile, /etc/hosts, and
each node's sshd_config. Everything lands under the sandbox's state directory."""

from __future__ import annotations

import contextlib
import getpass
import subprocess
from collections.abc import Sequence
from pathlib import Path

# Every session on a node carries these (sshd's SetEnv): what finds a node's processes
# when the node has no PID namespace of its own.
SANDBOX_ENV = "ORCH_SANDBOX_ID"
NODE_ENV = "ORCH_SANDBOX_NODE"

# sshd settings that differ between the kinds of node the sandbox can stand in for.
SSHD_PROFILES: dict[str, tuple[str, ...]] = {
    # Benchmarks open many sessions at once; OpenSSH's 10:30:100 drops them.
    "default": ("MaxStartups 512:30:1024", "MaxSessions 256", "Subsystem sftp internal-sftp"),
    # A hardened cluster: no SFTP subsystem, OpenSSH's default session limits, no
    # forwarding of any kind.
    "hardened": (
        "MaxStartups 10:30:100",
        "MaxSessions 10",
        "AllowTcpForwarding no",
        "AllowAgentForwarding no",
        "X11Forwarding no",
    ),
    # Compute nodes of a cluster that forbids SSH into them (or admits only users with a
    # job there, through PAM): sshd answers, and refuses every login after the key.
    "no-ssh": ("MaxStartups 10:30:100", "MaxSessions 10", "DenyUsers *"),
}


def node_dir(directory: Path, name: str) -> Path:
    return directory / "nodes" / name


def hosts_file(directory: Path) -> Path:
    """The /etc/hosts every node sees (bind-mounted in its mount namespace)."""
    return directory / "hosts"


def _keygen(path: Path, comment: str) -> str:
    for suffix in ("", ".pub"):
        with contextlib.suppress(FileNotFoundError):
            Path(f"{path}{suffix}").unlink()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return Path(f"{path}.pub").read_text().strip()


def write_keys_and_files(directory: Path, names: Sequence[str], addresses: Sequence[str],
                         port: int, user: str, slots: int) -> None:  # fmt: skip
    """The client key and its authorized_keys, each node's host key, known_hosts,
    ssh_config, the hostfile and the nodes' /etc/hosts."""
    d = directory
    client_pub = _keygen(d / "id_ed25519", f"orch-sandbox-client@{d}")
    (d / "authorized_keys").write_text(client_pub + "\n")
    known: list[str] = []
    for name, address in zip(names, addresses, strict=True):
        node_dir(d, name).mkdir(parents=True, exist_ok=True)
        host_pub = _keygen(node_dir(d, name) / "ssh_host_ed25519_key", f"orch-sandbox-{name}")
        keytype, key = host_pub.split()[:2]
        hosts = [name, address] if port == 22 else [f"[{name}]:{port}", f"[{address}]:{port}"]
        known.append(f"{','.join(hosts)} {keytype} {key}")
    (d / "known_hosts").write_text("\n".join(known) + "\n")
    (d / "ssh_config").write_text(_ssh_config(d, names, addresses, port, user))
    (d / "hostfile").write_text("".join(f"{name} slots={slots}\n" for name in names))
    hosts_file(d).write_text(_etc_hosts(names, addresses))


def _ssh_config(directory: Path, names: Sequence[str], addresses: Sequence[str], port: int,
                user: str, identity: Path | None = None,
                known_hosts: Path | None = None) -> str:  # fmt: skip
    d = directory
    identity = identity or d / "id_ed25519"
    known_hosts = known_hosts or d / "known_hosts"
    blocks = [f"# orch sandbox {d}: written by `orch sandbox up`, removed by `down`"]
    for name, address in zip(names, addresses, strict=True):
        blocks.append(
            "\n".join(
                [
                    f"Host {name} {address}",  # a hostfile may name it either way
                    f"    HostName {address}",
                    f"    Port {port}",
                    f"    User {user}",
                    f"    IdentityFile {identity}",
                    "    IdentitiesOnly yes",
                    f"    UserKnownHostsFile {known_hosts}",
                    "    StrictHostKeyChecking yes",
                    "    CheckHostIP no",
                    "    BatchMode yes",
                    "    ConnectTimeout 10",
                    "    LogLevel ERROR",
                ]
            )
        )
    return "\n\n".join(blocks) + "\n"


def _etc_hosts(names: Sequence[str], addresses: Sequence[str]) -> str:
    """This machine's /etc/hosts with every node's name added."""
    try:
        base_hosts = Path("/etc/hosts").read_text()
    except OSError:
        base_hosts = "127.0.0.1 localhost\n"
    extra = "".join(f"{address} {name}\n" for name, address in zip(names, addresses, strict=True))
    return base_hosts.rstrip("\n") + "\n# orch sandbox nodes\n" + extra


GUESTS_DIR = "guests"  # <user>.pub: the public key of each other account the nodes accept


def guests(directory: Path) -> list[str]:
    """The other accounts this sandbox's nodes accept (`orch sandbox up --guest USER`)."""
    folder = directory / GUESTS_DIR
    return sorted(p.stem for p in folder.glob("*.pub")) if folder.is_dir() else []


def guest_ssh_config(directory: Path, names: Sequence[str], addresses: Sequence[str],
                     port: int, guest: str, identity: Path, known_hosts: Path) -> str:  # fmt: skip
    """A guest's own client configuration: its name and key, the nodes' host keys."""
    return _ssh_config(directory, names, addresses, port, guest, identity, known_hosts)


def _guest_keys(directory: Path) -> list[str]:
    """sshd reads a user's keys as that user, who cannot read the sandbox's directory: a
    guest logs in with the keys in its own ~/.ssh/authorized_keys (last: a Match block)."""
    names = guests(directory)
    if not names:
        return []
    return [f"Match User {','.join(names)}", "    AuthorizedKeysFile .ssh/authorized_keys"]


def write_sshd_config(directory: Path, name: str, address: str, port: int, sandbox_id: str,
                      profile: str) -> Path:  # fmt: skip
    d = directory
    config = node_dir(d, name) / "sshd_config"
    # Each account logs in with the keys the sandbox holds for it, and nothing else.
    allowed = " ".join([getpass.getuser(), *guests(d)])
    config.write_text(
        "\n".join(
            [
                f"ListenAddress {address}:{port}",
                f"HostKey {node_dir(d, name) / 'ssh_host_ed25519_key'}",
                "PidFile none",
                f"AuthorizedKeysFile {d / 'authorized_keys'}",
                "StrictModes no",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "UsePAM no",
                f"AllowUsers {allowed}",
                "PrintMotd no",
                "PrintLastLog no",
                "UseDNS no",
                *SSHD_PROFILES[profile],
                f"SetEnv {SANDBOX_ENV}={sandbox_id} {NODE_ENV}={name}",
                "LogLevel ERROR",
                *_guest_keys(d),
                "",
            ]
        )
    )
    return config
