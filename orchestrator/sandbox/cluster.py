"""The `Sandbox`: one loopback cluster, brought up, looked at and taken down as a whole."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
from pathlib import Path

from orchestrator.errors import SandboxError
from orchestrator.sandbox import faults, guests
from orchestrator.sandbox import slurm as slurm_daemons
from orchestrator.sandbox.include import install_include, remove_include
from orchestrator.sandbox.nodes import (
    find_sshd,
    namespaces_available,
    require_tool,
    start_node,
    stop_node,
    wait_ready,
)
from orchestrator.sandbox.ports import pick_ssh_port, port_open, ports_claimed
from orchestrator.sandbox.processes import kill_processes_with_env, node_pids, still_ours
from orchestrator.sandbox.render import (
    GUESTS_DIR,
    SANDBOX_ENV,
    SSHD_PROFILES,
    write_keys_and_files,
)
from orchestrator.sandbox.state import (
    SandboxNode,
    SandboxNodeStatus,
    SandboxState,
    default_directory,
    load_state,
    sandbox_id_for,
    save_state,
    subnet_for,
)

DEFAULT_PREFIX = "node"


class Sandbox:
    """One loopback cluster, identified by its state directory."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = (directory or default_directory()).expanduser().resolve()

    def load(self) -> SandboxState | None:
        return load_state(self.directory)

    # ----- up ----------------------------------------------------------------
    def up(self, nodes: int = 4, slots: int = 2, prefix: str = DEFAULT_PREFIX,
           sshd_profile: str = "default", slurm: bool = False,
           shared_pids: bool = False,
           guest_users: tuple[str, ...] = ()) -> SandboxState:  # fmt: skip
        """Start the nodes, or keep them if they are up as asked. With `shared_pids` the
        nodes share this machine's PID namespace (each keeps its hostname and /etc/hosts)."""
        _check_request(nodes, slots, sshd_profile)
        current = self.load()
        if current is not None:
            if current.guests == tuple(guest_users) and self._is_up_as(
                current, nodes, slots, prefix, sshd_profile, slurm, shared_pids
            ):
                return current
            self.down()
        sshd = find_sshd()
        require_tool("ssh-keygen", "openssh-client")
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        use_ns = namespaces_available()
        if slurm:
            slurm_daemons.require_tools()
            if not use_ns:
                raise SandboxError(
                    "a Slurm sandbox needs each node in its own namespaces (root and unshare), "
                    "so that every slurmd answers under its node's hostname",
                    "run `orch sandbox up --slurm` as root on a machine where unshare works",
                )
        subnet = subnet_for(self.directory)
        addresses = [f"{subnet}.{k}" for k in range(1, nodes + 1)]
        sandbox_id = sandbox_id_for(self.directory)
        names = [f"{prefix}{k}" for k in range(1, nodes + 1)]
        user = getpass.getuser()
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        started: list[SandboxNode] = []
        try:
            # From picking the ports until every daemon listens on its own.
            with ports_claimed():
                port = pick_ssh_port(addresses)
                write_keys_and_files(self.directory, names, addresses, port, user, slots)
                for guest in guest_users:
                    guests.admit(self.directory, guest)
                for name, address in zip(names, addresses, strict=True):
                    pid = start_node(self.directory, sshd, name, address, port, sandbox_id,
                                     use_ns, sshd_profile, shared_pids)  # fmt: skip
                    started.append(SandboxNode(name=name, address=address, port=port, pid=pid))
                state = SandboxState(
                    directory=str(self.directory),
                    sandbox_id=sandbox_id,
                    prefix=prefix,
                    slots=slots,
                    namespaces=use_ns,
                    user=user,
                    nodes=tuple(started),
                    sshd_profile=sshd_profile,
                    shared_pids=shared_pids,
                    guests=tuple(guest_users),
                )
                save_state(state)
                wait_ready(state)
                if slurm:
                    state = slurm_daemons.start_over(state)
                    save_state(state)
            install_include(self.directory)
            for guest in guest_users:
                guests.hand_to(state, guest)
        except BaseException:
            for node in started:
                stop_node(node.pid, self.directory)
            raise
        return state

    def _is_up_as(self, current: SandboxState, nodes: int, slots: int, prefix: str,
                  sshd_profile: str, slurm: bool, shared_pids: bool) -> bool:  # fmt: skip
        wanted = (nodes, slots, prefix, sshd_profile, slurm, shared_pids)
        have = (len(current.nodes), current.slots, current.prefix, current.sshd_profile,
                bool(current.slurm_conf), current.shared_pids)  # fmt: skip
        return have == wanted and all(s.process_alive and s.port_open for s in self.status(current))

    # ----- status --------------------------------------------------------------
    def status(self, state: SandboxState | None = None) -> list[SandboxNodeStatus]:
        state = state or self.load()
        if state is None:
            return []
        return [
            SandboxNodeStatus(
                name=n.name,
                address=n.address,
                port=n.port,
                process_alive=still_ours(n.pid, state.directory),
                port_open=port_open(n.address, n.port, 0.5),
            )
            for n in state.nodes
        ]

    def slurm_states(self, state: SandboxState) -> dict[str, str]:
        """Each node's state in Slurm (sinfo), with --slurm; {} without, or no answer."""
        return slurm_daemons.sinfo_states(state)

    # ----- down ----------------------------------------------------------------
    def down(self) -> SandboxState | None:
        state = self.load()
        remove_include(self.directory)
        if state is None:
            return None
        for guest in state.guests:
            guests.release(state, guest)
        slurm_daemons.stop(state.slurm_pids, self.directory)
        for node in state.nodes:
            stop_node(node.pid, self.directory)
        shutil.rmtree(slurm_daemons.slurm_dir(self.directory), ignore_errors=True)
        # Whatever a session started and moved out of the node's reach (or every
        # session, without a PID namespace per node) still carries the sandbox id.
        kill_processes_with_env(SANDBOX_ENV, state.sandbox_id)
        for leftover in ("sandbox.json", "known_hosts", "ssh_config", "hostfile", "hosts"):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / leftover).unlink()
        shutil.rmtree(self.directory / "nodes", ignore_errors=True)
        shutil.rmtree(self.directory / GUESTS_DIR, ignore_errors=True)
        for key in ("id_ed25519", "id_ed25519.pub", "authorized_keys"):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / key).unlink()
        return state

    # ----- faults, for tests and benchmarks ------------------------------------
    def node_pids(self, name: str) -> list[int]:
        """Every process running on a node (its sshd included)."""
        return node_pids(self._require_state(), name)

    def freeze(self, name: str) -> None:
        """SIGSTOP every process of a node: sockets stay open, nothing answers."""
        faults.freeze(self._require_state(), name)

    def thaw(self, name: str) -> None:
        faults.thaw(self._require_state(), name)

    def shell_startup(self, name: str, script: str) -> Path:
        """Give one node its own ~/.bashrc (see `faults.shell_startup`)."""
        return faults.shell_startup(self._require_state(), name, script)

    def private_directory(self, name: str, path: Path, size_bytes: int | None = None) -> Path:
        """Give one node its own empty directory at `path`, of `size_bytes` if given (see
        `faults.private_directory`)."""
        return faults.private_directory(self._require_state(), name, path, size_bytes)

    def _require_state(self) -> SandboxState:
        state = self.load()
        if state is None:
            raise SandboxError("no sandbox is up", "run `orch sandbox up`")
        return state


def _check_request(nodes: int, slots: int, sshd_profile: str) -> None:
    if sshd_profile not in SSHD_PROFILES:
        raise SandboxError(
            f"no sshd profile {sshd_profile!r}", f"choose one of: {', '.join(SSHD_PROFILES)}"
        )
    if not 1 <= nodes <= 250:
        raise SandboxError(f"--nodes must be between 1 and 250, got {nodes}")
    if slots < 1:
        raise SandboxError(f"--slots must be at least 1, got {slots}")
