"""paramiko, and nothing else of orch talks to it: ssh_config (config), known hosts and the
host-key verdict (known_hosts), connecting with keys only (connect), sessions and remote
processes (session), and running on many nodes at once, one result per node (group).
Callers outside ssh/ import from here.
"""

from orchestrator.ssh.config import SSHTarget, expand_includes, load_ssh_config, resolve_target
from orchestrator.ssh.connect import open_session
from orchestrator.ssh.errors import SSHError, SSHFailure
from orchestrator.ssh.group import failure_result, run_on_nodes
from orchestrator.ssh.known_hosts import check_host_key, host_matches, parse_known_hosts
from orchestrator.ssh.session import CommandResult, NodeSession, RemoteProcess, SFTPClient

__all__ = [
    "CommandResult",
    "NodeSession",
    "RemoteProcess",
    "SFTPClient",
    "SSHError",
    "SSHFailure",
    "SSHTarget",
    "check_host_key",
    "expand_includes",
    "failure_result",
    "host_matches",
    "load_ssh_config",
    "open_session",
    "parse_known_hosts",
    "resolve_target",
    "run_on_nodes",
]
