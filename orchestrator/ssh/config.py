"""~/.ssh/config as OpenSSH reads it (Include expanded, which paramiko's SSHConfig does not
do), resolved into what one connection needs: `SSHTarget`."""

from __future__ import annotations

import getpass
import glob
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import paramiko

from orchestrator.errors import OrchError

DEFAULT_USER_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
_MAX_INCLUDE_DEPTH = 16
# ----- ssh_config ----------------------------------------------------------------
def _include_paths(argument: str, base_dir: Path) -> list[Path]:
    paths: list[Path] = []
    for word in shlex.split(argument):
        pattern = os.path.expanduser(word)
        if not os.path.isabs(pattern):
            # OpenSSH: relative user-config includes are relative to ~/.ssh.
            pattern = str(base_dir / pattern)
        paths.extend(Path(p) for p in sorted(glob.glob(pattern)))
    return paths


def expand_includes(text: str, base_dir: Path, depth: int = 0) -> str:
    """Inline every `Include` (globs, ~, relative to ~/.ssh), recursively."""
    if depth > _MAX_INCLUDE_DEPTH:
        raise OrchError(
            "ssh config: Include nested too deeply (a loop?)",
            "check the Include lines of ~/.ssh/config",
        )
    out: list[str] = []
    for line in text.splitlines():
        match = re.match(r"\s*include(?:\s*=\s*|\s+)(.+)$", line, re.IGNORECASE)
        if not match:
            out.append(line)
            continue
        for path in _include_paths(match.group(1).strip(), base_dir):
            try:
                included = path.read_text()
            except OSError:
                continue  # OpenSSH ignores includes it cannot read
            out.append(expand_includes(included, base_dir, depth + 1))
    return "\n".join(out) + "\n"


def _read_config(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
    except OSError as err:
        raise OrchError(f"{path}: cannot read ({err})", "fix its permissions") from err


def load_ssh_config(
    path: str | os.PathLike[str] = DEFAULT_USER_CONFIG,
    system_path: str | os.PathLike[str] | None = SYSTEM_CONFIG,
) -> paramiko.SSHConfig:
    """The user's ssh_config, then the system one (first value wins, as in OpenSSH)."""
    config_path = Path(os.path.expanduser(str(path)))
    text = expand_includes(_read_config(config_path), Path(os.path.expanduser("~/.ssh")))
    if system_path is not None:
        system = Path(system_path)
        # `Host *` closes the user's last Host block, so the system file's
        # global lines apply to every host and not only to that block.
        text += "\nHost *\n" + expand_includes(_read_config(system), system.parent)
    try:
        return paramiko.SSHConfig.from_text(text)
    except Exception as err:
        raise OrchError(
            f"{config_path}: ssh config does not parse ({err})", "fix the line it names"
        ) from err


@dataclass(frozen=True)
class SSHTarget:
    """Everything needed to reach one node, as ssh_config resolves it."""

    node: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    use_agent: bool
    known_hosts_files: tuple[str, ...]
    host_key_alias: str | None
    strict: str  # "yes" | "accept-new"
    connect_timeout: float | None
    proxy_jump: tuple[str, ...]
    proxy_command: str | None

    @property
    def host_key_name(self) -> str:
        """The name known_hosts is searched for, as OpenSSH does."""
        host = self.host_key_alias or self.hostname
        return host if self.port == 22 else f"[{host}]:{self.port}"


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


def resolve_target(
    node: str, config: paramiko.SSHConfig | None = None, *, accept_new: bool = False
) -> SSHTarget:
    """Apply ssh_config to a node name (an alias, a host name or an address)."""
    host, user_override, port_override = _split_destination(node)
    options = (config or load_ssh_config()).lookup(host)
    known = []
    for entry in _as_list(options.get("userknownhostsfile")):
        known.extend(shlex.split(entry))
    if not known:
        known = list(DEFAULT_KNOWN_HOSTS)
    for entry in _as_list(options.get("globalknownhostsfile")) or list(GLOBAL_KNOWN_HOSTS):
        known.extend(shlex.split(entry))
    strict = str(options.get("stricthostkeychecking", "ask")).lower()
    # `no`/`off`/`ask` are all treated as `yes`: orch never accepts a key silently
    # and never prompts. `accept-new` (or the CLI flag) records unknown keys.
    mode = "accept-new" if accept_new or strict == "accept-new" else "yes"
    jump = str(options.get("proxyjump", "none"))
    proxy_command = options.get("proxycommand")
    timeout = options.get("connecttimeout")
    agent_opt = str(options.get("identityagent", "")).lower()
    return SSHTarget(
        node=node,
        hostname=str(options.get("hostname", host)),
        port=int(port_override or options.get("port", 22)),
        user=user_override or str(options.get("user", getpass.getuser())),
        identity_files=tuple(os.path.expanduser(p) for p in _as_list(options.get("identityfile"))),
        identities_only=str(options.get("identitiesonly", "no")).lower() == "yes",
        use_agent=agent_opt != "none",
        known_hosts_files=tuple(os.path.expanduser(p) for p in known if p.lower() != "none"),
        host_key_alias=options.get("hostkeyalias"),
        strict=mode,
        connect_timeout=float(timeout) if timeout else None,
        proxy_jump=tuple(j for j in jump.split(",") if j and j.lower() != "none"),
        proxy_command=None
        if proxy_command is None or str(proxy_command).lower() == "none"
        else str(proxy_command),
    )


def _split_destination(dest: str) -> tuple[str, str | None, int | None]:
    """`user@host:port` (as in ProxyJump) -> parts; a plain name stays as it is."""
    user = None
    if "@" in dest:
        user, dest = dest.rsplit("@", 1)
    port = None
    match = re.fullmatch(r"\[(.+)\]:(\d+)|([^:]+):(\d+)", dest)
    if match:
        dest = match.group(1) or match.group(3)
        port = int(match.group(2) or match.group(4))
    return dest, user, port
