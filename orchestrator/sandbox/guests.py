"""Other accounts on a sandbox's nodes (`orch sandbox up --guest USER`, as root): the nodes
accept each guest with its own key (~USER/.ssh/id_ed25519), and the guest gets a client
configuration of its own (its name, its key, the nodes' host keys), included at the top of
its ~/.ssh/config. Several ordinary users then share the same nodes, as on a real cluster."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from orchestrator.errors import SandboxError
from orchestrator.sandbox.include import install_include, remove_include
from orchestrator.sandbox.render import GUESTS_DIR, guest_ssh_config
from orchestrator.sandbox.state import SandboxState


def _account(guest: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(guest)
    except KeyError:
        raise SandboxError(f"no account {guest!r} on this machine",
                           f"create it first: useradd -m {guest}") from None  # fmt: skip


def _key(account: pwd.struct_passwd) -> Path:
    return Path(account.pw_dir) / ".ssh" / "id_ed25519"


def admit(directory: Path, guest: str) -> None:
    """Let the nodes accept `guest` with its own public key (before they start)."""
    if os.geteuid() != 0:
        raise SandboxError("only a sandbox run as root can accept other accounts",
                           "run `orch sandbox up --guest USER` as root")  # fmt: skip
    account = _account(guest)
    public = _key(account).with_suffix(".pub")
    if not public.is_file():
        raise SandboxError(f"{guest} has no key {public}",
                           f"create one as {guest}: ssh-keygen -t ed25519 -N '' "
                           f"-f {_key(account)}")  # fmt: skip
    folder = directory / GUESTS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(public, folder / f"{guest}.pub")
    # sshd reads it as the guest: the key goes where the guest itself would put it.
    key = public.read_text().strip()
    authorized = public.parent / "authorized_keys"
    known = authorized.read_text().splitlines() if authorized.exists() else []
    if key not in known:
        authorized.write_text("\n".join([*known, key]) + "\n")
    authorized.chmod(0o600)
    os.chown(authorized, account.pw_uid, account.pw_gid)


def client_dir(state: SandboxState, guest: str) -> Path:
    return Path(_account(guest).pw_dir) / ".ssh" / f"orch-sandbox-{state.sandbox_id}"


def hand_to(state: SandboxState, guest: str) -> Path:
    """Write `guest`'s client files and include them in its ~/.ssh/config; returns the
    hostfile it reads."""
    account = _account(guest)
    directory = Path(state.directory)
    client = client_dir(state, guest)
    client.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(state.known_hosts, client / "known_hosts")
    shutil.copyfile(state.hostfile, client / "hostfile")
    names = [n.name for n in state.nodes]
    addresses = [n.address for n in state.nodes]
    port = state.nodes[0].port
    (client / "ssh_config").write_text(guest_ssh_config(
        directory, names, addresses, port, guest, _key(account), client / "known_hosts"))
    home = Path(account.pw_dir)
    install_include(directory, home=home, config_file=client / "ssh_config")
    ssh_dir = home / ".ssh"
    for path in (ssh_dir, *ssh_dir.iterdir(), *client.iterdir()):
        os.chown(path, account.pw_uid, account.pw_gid, follow_symlinks=False)
    return client / "hostfile"


def release(state: SandboxState, guest: str) -> None:
    """Take the guest's client files and include back out (its account stays)."""
    try:
        account = _account(guest)
    except SandboxError:
        return  # the account is gone, and its home with it
    remove_include(Path(state.directory), home=Path(account.pw_dir))
    shutil.rmtree(client_dir(state, guest), ignore_errors=True)
