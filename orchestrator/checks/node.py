"""Checks of each node on its own: reachable, interpreter, files, known traps, GPUs, disk,
the accelerate config. Pure: facts in, findings out."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.checks.environment import PushFix, with_push
from orchestrator.checks.model import CLUSTER, Finding, NodeProbe, Severity, with_facts
from orchestrator.pernode import ShellStartup
from orchestrator.remote import owned
from orchestrator.specs.units import format_bytes

if TYPE_CHECKING:
    from orchestrator.probe.facts import NodeFacts, OwnDirectory

GIB = 1 << 30
DISK_ERROR_BYTES = 1 * GIB
DISK_WARNING_BYTES = 5 * GIB


# ----- reachability and the probe itself ---------------------------------------------
def check_reachability(probes: Sequence[NodeProbe]) -> list[Finding]:
    findings = []
    for probe in probes:
        if probe.error is not None:
            group = "python" if probe.error.kind == "probe" else "ssh"
            findings.append(Finding(probe.node, group, probe.error.message, probe.error.hint))
    return findings


SLOW_SHELL_S = 2.0  # a shell start-up slower than this delays every command orch runs there
_SHELL_FIX = (
    "look at the start-up files of your login shell on {node} (~/.bashrc, ~/.bash_profile, "
    "/etc/bash.bashrc): SSH commands run them too. Make them quiet and quick when not "
    "interactive, e.g. `case $- in *i*) ;; *) return;; esac` at the top of ~/.bashrc before "
    "`pyenv init`/`conda init`, or clear a stale lock (`pyenv rehash` leaves "
    "~/.pyenv/shims/.pyenv-shim)"
)


def check_shell(probes: Sequence[NodeProbe]) -> list[Finding]:
    """The user's shell on each node, timed as the probe starts: a start-up slower than
    SLOW_SHELL_S, or one that prints on stderr (warnings: the probe's own result says whether
    commands still work; one that timed out says what the node printed)."""
    findings = []
    for probe in probes:
        problem = None if probe.shell is None else _shell_problem(probe.node, probe.shell)
        if problem:
            fix = _SHELL_FIX.format(node=probe.node)
            findings.append(Finding(probe.node, "shell", problem, fix, "warning"))
    return findings


def _shell_problem(node: str, shell: ShellStartup) -> str:
    what = []
    if shell.seconds > SLOW_SHELL_S:
        what.append(f"the shell on {node} takes {shell.seconds:.1f}s to start (timed over "
                    "SSH until it runs orch's command): every command orch runs there waits "
                    "that long")  # fmt: skip
    if shell.stderr:
        what.append(f"its start-up prints on stderr on {node}: {shell.stderr}")
    return "; ".join(what)


# ----- interpreter, files, known traps ------------------------------------------------------
def check_interpreter(probes: Sequence[NodeProbe], python: str,
                      push: PushFix | None = None) -> list[Finding]:  # fmt: skip
    """A node without the job's interpreter, or without torch for it. `push`: how the head's
    environment could be copied there, named in the fix."""
    findings = []
    for facts in with_facts(probes):
        node = facts.node
        if not facts.python_found:
            fix = (f"create the same environment at {python} on {node} (same path on every "
                   "node), or pass --python with a path valid everywhere")  # fmt: skip
            findings.append(
                Finding(
                    node,
                    "python",
                    f"the job's interpreter {python} does not exist on {node} "
                    f"(the probe fell back to {facts.python_executable})",
                    with_push(fix, push),
                )
            )
        elif facts.packages.get("torch") is None:
            fix = (f"on {node}: `{shlex.quote(python)} -m pip install torch` (the same "
                   "version as the other nodes)")  # fmt: skip
            findings.append(
                Finding(
                    node,
                    "python",
                    f"torch is not installed for {python} on {node}",
                    with_push(fix, push),
                )
            )
    return findings


# What each place in the user's own directory on a node is for, as a finding names it.
_OWN_DIR_USE = {
    "runs": "the job's files on this node (its node directory)",
    "ports": "the main port's reservation",
}


def check_own_directories(probes: Sequence[NodeProbe]) -> list[Finding]:
    """A node where the launch could not make the user's directory, or one there is not the
    user's own (a link, another user's, writable by others), or no file can be made in it:
    the launch would fail there. A node where another user's /tmp/orch-<uid> made orch keep
    its files in $XDG_RUNTIME_DIR/orch instead: a warning, naming both."""
    findings = []
    for facts in with_facts(probes):
        findings.extend(_moved(facts.node, facts.own_dirs))
        for place in facts.own_dirs:
            if place.problem is None:
                continue
            use = _OWN_DIR_USE.get(place.what, place.what)
            findings.append(Finding(
                facts.node, "files",
                f"{facts.node}: {place.path} cannot hold {use}: {place.problem}",
                f"on {facts.node}: {place.fix or 'see the problem'}",
            ))  # fmt: skip
    return findings


def _moved(node: str, places: Sequence[OwnDirectory]) -> list[Finding]:
    """One warning where the node's places are not in /tmp/orch-<uid>, and why."""
    moved = next((p for p in places if p.instead_of), None)
    if moved is None:
        return []
    top = os.path.dirname(moved.path)
    return [Finding(
        node, "files",
        f"{node}: {moved.why}: orch keeps its files in {top} there instead (your "
        "$XDG_RUNTIME_DIR)",
        f"on {node}: nothing to do; to choose the place, {owned.NODE_WAY}",
        severity="warning",
    )]  # fmt: skip


def check_known_traps(probes: Sequence[NodeProbe], python: str) -> list[Finding]:
    findings = []
    for facts in with_facts(probes):
        pkgs = facts.packages
        if pkgs.get("accelerate") and pkgs.get("deepspeed") and not pkgs.get("transformers"):
            findings.append(
                Finding(
                    facts.node,
                    "python",
                    f"accelerate {pkgs['accelerate']} with DeepSpeed but no transformers on "
                    f"{facts.node}: accelerate's DeepSpeed plugin imports transformers and "
                    "every rank fails at start-up without it",
                    f"on {facts.node}: `{shlex.quote(python)} -m pip install transformers`",
                )
            )
    return findings


def check_files(
    probes: Sequence[NodeProbe],
    *,
    workdir: str | None,
    script: str | None,
    head_script_sha256: str | None = None,
) -> list[Finding]:
    findings = []
    for facts in with_facts(probes):
        if workdir and not facts.workdir_exists:
            findings.append(
                Finding(
                    facts.node,
                    "files",
                    f"working directory {workdir} does not exist on {facts.node}",
                    f"create it on {facts.node} (or use a shared filesystem), "
                    "or pass --workdir with a directory every node has",
                )
            )
        if script and facts.script_exists is False:
            findings.append(
                Finding(
                    facts.node,
                    "files",
                    f"script {script} does not exist on {facts.node}",
                    f"copy it there: `scp {shlex.quote(script)} {facts.node}:"
                    f"{shlex.quote(script)}`, or put it on a shared filesystem",
                )
            )
        elif (
            head_script_sha256 and facts.script_sha256 and facts.script_sha256 != head_script_sha256
        ):
            findings.append(
                Finding(
                    facts.node,
                    "files",
                    f"script {script} on {facts.node} differs from this machine's copy "
                    f"(sha256 {facts.script_sha256[:12]} vs {head_script_sha256[:12]})",
                    f"copy the current version: `scp {shlex.quote(script or '')} "
                    f"{facts.node}:{shlex.quote(script or '')}`",
                )
            )
    return findings


# ----- GPUs and disk ---------------------------------------------------------------------
def check_gpus(probes: Sequence[NodeProbe], slots: Mapping[str, int]) -> list[Finding]:
    findings = []
    for f in with_facts(probes):
        if f.nvidia_smi.startswith("error"):
            findings.append(
                Finding(
                    f.node,
                    "gpu",
                    f"nvidia-smi fails on {f.node}: {f.nvidia_smi.removeprefix('error: ')}",
                    "check the NVIDIA driver on the node (a reboot after a driver update?)",
                )
            )
            continue
        if f.gpu_busy_pids:
            findings.append(
                Finding(
                    f.node,
                    "gpu",
                    f"GPUs on {f.node} are busy with other processes "
                    f"(pids {', '.join(f.gpu_busy_pids)})",
                    "wait for them to finish or stop them (a previous job left behind?)",
                    "warning",
                )
            )
        wanted = slots.get(f.node)
        if f.gpu_count and wanted and wanted > f.gpu_count:
            findings.append(
                Finding(
                    f.node,
                    "gpu",
                    f"the hostfile gives {f.node} {wanted} slots but it has {f.gpu_count} GPUs",
                    f"set `{f.node} slots={f.gpu_count}` in the hostfile",
                )
            )
        if f.torch_cuda and f.nvidia_smi == "absent":
            findings.append(
                Finding(
                    f.node,
                    "gpu",
                    f"torch is built for CUDA {f.torch_cuda} but {f.node} has no nvidia-smi",
                    "install the NVIDIA driver, or use a CPU build of torch",
                    "warning",
                )
            )
    return findings


def check_disk(probes: Sequence[NodeProbe]) -> list[Finding]:
    findings = []
    for f in with_facts(probes):
        free = f.disk_free_bytes
        if free is None:
            continue
        if free < DISK_WARNING_BYTES:
            severity: Severity = "error" if free < DISK_ERROR_BYTES else "warning"
            findings.append(
                Finding(
                    f.node,
                    "disk",
                    f"only {format_bytes(free)} free in {f.disk_path} on {f.node}",
                    "free space there (checkpoints and logs need room)",
                    severity,
                )
            )
    return findings


# ----- accelerate config traps ---------------------------------------------------------------
def check_accelerate_config(config: Mapping[str, Any], path: str) -> list[Finding]:
    """The multi-node DeepSpeed traps of an accelerate config (as loaded from YAML)."""
    findings = []
    machines = int(config.get("num_machines") or 1)
    ds = config.get("deepspeed_config") or {}
    if config.get("distributed_type") == "DEEPSPEED" and machines > 1:
        launcher = ds.get("deepspeed_multinode_launcher") or "pdsh"
        if launcher != "standard" and not ds.get("deepspeed_hostfile"):
            findings.append(
                Finding(
                    CLUSTER,
                    "files",
                    f"{path}: deepspeed_hostfile is unset with num_machines={machines}: "
                    "accelerate only warns and the job runs on one node",
                    "set deepspeed_config.deepspeed_hostfile to the hostfile path "
                    "(`orch config` writes it)",
                )
            )
    return findings


# ----- whether stacks can be taken (`orch stacks`, hangs, teardown) -------------------------
def stacks_problem(f: NodeFacts, python: str) -> tuple[str, str] | None:
    """Why py-spy could not read the ranks' stacks on this node, and the fix; None when
    it can. py-spy attaches with ptrace: root (with CAP_SYS_PTRACE, which containers
    drop), or the job's own user where Yama allows it (ptrace_scope 0; at 1 only a
    process's ancestors may attach, and py-spy is not the ranks' ancestor)."""
    if f.py_spy is None:
        return (
            f"py-spy not found beside {python} or on PATH on {f.node}",
            f"{python} -m pip install py-spy (orch's own setup installs it)",
        )
    if f.root and not f.cap_sys_ptrace:
        return (
            f"root on {f.node} lacks CAP_SYS_PTRACE (a container drops it)",
            "start the container with --cap-add SYS_PTRACE",
        )
    if f.ptrace_scope == 3:
        return (f"ptrace is disabled on {f.node} (kernel.yama.ptrace_scope=3)",
                "reboot with kernel.yama.ptrace_scope=1 or lower")  # fmt: skip
    if not f.root and f.ptrace_scope in (1, 2):
        return (
            f"kernel.yama.ptrace_scope={f.ptrace_scope} on {f.node}: py-spy may not attach to "
            "ranks it did not start",
            "sysctl -w kernel.yama.ptrace_scope=0 (as root), or run the job as root",
        )
    return None


FALLBACK_NOTE = (
    "orch stacks falls back to each rank's faulthandler (no ptrace needed; Python frames "
    "only, profiles at 20 samples/s)"
)


def check_stacks(probes: Sequence[NodeProbe], python: str) -> list[Finding]:
    """A warning per node where py-spy cannot take stacks: the job runs, its hangs are
    detected, and orch reads the ranks' stacks from their own faulthandler instead (no
    native frames, coarser profiles)."""
    findings = []
    for f in with_facts(probes):
        problem = stacks_problem(f, python) if f.stacks_probed else None
        if problem is not None:
            message, fix = problem
            said = f"py-spy cannot take stacks: {message}; {FALLBACK_NOTE}"
            findings.append(Finding(f.node, "stacks", said, fix, "warning"))
    return findings
