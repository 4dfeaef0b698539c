"""A home of the tests' own: HOME, the XDG directories and the SSH client configuration of a
test session point into a temporary directory, so that no test reads or edits the
developer's files (a sandbox adds an `Include` block to ~/.ssh/config).

OpenSSH's client reads ~/.ssh/config from the home of the passwd entry, whatever $HOME
says: the temporary home's bin/ holds an `ssh` that reads $HOME/.ssh/config instead, and
goes first on PATH, so pdsh and the tests' own ssh reach the sandbox's nodes by name as
orch (paramiko, which follows $HOME) does. Every program the tests start inherits it."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

SYSTEM_SSH_CONFIG = Path("/etc/ssh/ssh_config")
# What points into the developer's own orch state; a test that needs one sets it itself.
CLEARED = ("ORCH_SANDBOX_DIR", "ORCH_RUNS_DIR", "ORCH_JOB_ID")
XDG = {"XDG_CONFIG_HOME": ".config", "XDG_CACHE_HOME": ".cache", "XDG_DATA_HOME": ".local/share",
       "XDG_STATE_HOME": ".local/state"}  # fmt: skip


@dataclass(frozen=True)
class TestHome:
    """The session's home and the environment that points at it."""

    path: Path
    environ: dict[str, str]  # what to set
    cleared: tuple[str, ...]  # what to unset


def developers_ssh_config() -> Path:
    """The file OpenSSH reads for this user without the tests' `ssh`."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "config"


def fingerprint(path: Path) -> str | None:
    """What `path` holds (None: nothing), to tell afterwards that nobody changed it."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _ssh_wrapper(real_ssh: str) -> str:
    return (
        "#!/bin/sh\n"
        "# The tests' home: read $HOME's SSH configuration, never the passwd entry's.\n"
        'if [ -f "$HOME/.ssh/config" ]; then config="$HOME/.ssh/config"; '
        f"else config={SYSTEM_SSH_CONFIG}; fi\n"
        f'exec {real_ssh} -F "$config" "$@"\n'
    )


def make_test_home(path_environ: str) -> TestHome:
    """A fresh temporary home: .ssh/config (the system's settings only, as a user without a
    configuration of their own has), the XDG directories and bin/ssh."""
    home = Path(tempfile.mkdtemp(prefix="orch-test-home-"))
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    # With -F the system-wide file is not read: the user's file includes it, last.
    system = f"Include {SYSTEM_SSH_CONFIG}\n" if SYSTEM_SSH_CONFIG.is_file() else ""
    (ssh_dir / "config").write_text(f"# the tests' home\n{system}")
    (ssh_dir / "config").chmod(0o600)
    environ = {name: str(home / sub) for name, sub in XDG.items()}
    for folder in environ.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    bin_dir = home / "bin"
    bin_dir.mkdir()
    real_ssh = shutil.which("ssh", path=path_environ)
    if real_ssh:
        wrapper = bin_dir / "ssh"
        wrapper.write_text(_ssh_wrapper(real_ssh))
        wrapper.chmod(0o755)
    environ["HOME"] = str(home)
    # The one thing kept from the developer's home: DeepSpeed's CPU op, built there once by
    # scripts/setup.sh (minutes on 2 cores), which a job would otherwise build again.
    environ["TORCH_EXTENSIONS_DIR"] = os.environ.get("TORCH_EXTENSIONS_DIR") or str(
        Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "orch" / "torch_extensions"
    )
    environ["PATH"] = os.pathsep.join([str(bin_dir), path_environ])
    return TestHome(path=home, environ=environ, cleared=CLEARED)
