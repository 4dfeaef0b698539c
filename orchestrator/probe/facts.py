"""What a node's probe printed, parsed: `NodeFacts`, and node 0's listening line. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ProbeError(ValueError):
    """The probe's output is not the JSON document it should print."""


def parse_listening(line: bytes | None) -> tuple[bool, str | None]:
    """Node 0's first line: (is it holding the main port, why not)."""
    try:
        doc = json.loads(line or b"")
    except ValueError:
        text = (line or b"").decode(errors="replace").strip()
        return False, text[:200] or "no answer"
    if not isinstance(doc, dict) or "listening" not in doc:
        return False, "unexpected answer"
    return bool(doc["listening"]), doc.get("error")


@dataclass(frozen=True)
class GpuInfo:
    index: str
    name: str
    driver: str
    memory_used_mib: str
    uuid: str


@dataclass(frozen=True)
class OwnDirectory:
    """A place in the user's own directory on the node that a launch needs (`what`: runs,
    the jobs' node directories; ports, the port reservations), and what the probe found
    wrong making it and a file in it (problem and fix as the node said them; None: usable).
    `instead_of`, `why`: the place orch would have used (/tmp/orch-<uid>) and why it did
    not (another user made it first), when it chose $XDG_RUNTIME_DIR/orch instead."""

    what: str
    path: str
    problem: str | None = None
    fix: str | None = None
    instead_of: str | None = None
    why: str | None = None


@dataclass(frozen=True)
class Environment:
    """The job's interpreter and every distribution it sees (remote/environment.py)."""

    fingerprint: str
    implementation: str
    python_version: str
    abi: str
    os: str
    libc: str
    machine: str
    dists: Mapping[str, str]  # normalized name -> version

    @property
    def platform(self) -> str:
        return ", ".join(v for v in (self.os, self.libc, self.machine) if v)


def parse_environment(doc: Any) -> Environment | None:
    """remote/environment.py's document (None: not there, as from an older probe)."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("dists"), Mapping):
        return None
    return Environment(
        fingerprint=str(doc.get("fingerprint", "")),
        implementation=str(_get(doc, "interpreter", "implementation", default="")),
        python_version=str(_get(doc, "interpreter", "version", default="")),
        abi=str(_get(doc, "interpreter", "abi", default="")),
        os=str(_get(doc, "platform", "os", default="")),
        libc=str(_get(doc, "platform", "libc", default="")),
        machine=str(_get(doc, "platform", "machine", default="")),
        dists={str(k): str(v) for k, v in doc["dists"].items()},
    )


@dataclass(frozen=True)
class NodeFacts:
    node: str
    hostname: str
    os: str
    kernel: str
    python_requested: str | None
    python_found: bool
    python_executable: str
    python_version: str
    packages: Mapping[str, str | None]
    torch_cuda: str | None
    nvidia_smi: str  # "absent" | "ok" | "error: ..."
    gpus: tuple[GpuInfo, ...]
    gpu_busy_pids: tuple[str, ...]
    disk_path: str | None
    disk_free_bytes: int | None
    workdir: str | None
    workdir_exists: bool
    script: str | None
    script_exists: bool | None
    script_sha256: str | None
    interfaces: Mapping[str, tuple[str, ...]]
    ib_devices: tuple[str, ...]
    resolved: Mapping[str, tuple[str, ...]]
    resolve_errors: Mapping[str, str]
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    # node 0 only: the main port test and what it learnt from the peers
    port: int | None = None
    port_free: bool | None = None
    port_error: str | None = None
    peers: tuple[tuple[str | None, str], ...] = ()  # (hostname it sent, address it came from)
    hostnames: Mapping[str, tuple[str, ...] | str] = field(default_factory=dict)
    # every other node: did it reach the main port
    main_reached: bool | None = None
    main_error: str | None = None
    # whether `orch stacks` can read the ranks' stacks: the probe's "stacks" object
    py_spy: str | None = None
    ptrace_scope: int | None = None  # Yama's setting (None: no Yama)
    root: bool = False
    cap_sys_ptrace: bool = False
    stacks_probed: bool = False  # an older probe says nothing of stacks
    own_dirs: tuple[OwnDirectory, ...] = ()
    environment: Environment | None = None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_model(self) -> str | None:
        names = sorted({gpu.name for gpu in self.gpus})
        return ", ".join(names) if names else None

    @property
    def driver(self) -> str | None:
        drivers = sorted({gpu.driver for gpu in self.gpus})
        return ", ".join(drivers) if drivers else None


def _get(doc: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    value: Any = doc
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value


def _own_dirs(found: Any) -> tuple[OwnDirectory, ...]:
    """The probe's `own_dirs` list (an older probe has none)."""
    places = [d for d in found or () if isinstance(d, dict)]
    return tuple(
        OwnDirectory(
            str(d.get("what", "")), str(d.get("path", "")), d.get("problem"), d.get("fix"),
            d.get("instead_of"), d.get("why"),
        )
        for d in places
    )


def parse_facts(node: str, stdout: bytes | str) -> NodeFacts:
    """Parse the probe's JSON; ProbeError when it is not a probe document."""
    text = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
    lines = text.strip().splitlines()
    try:
        # The facts are the last line (node 0 prints a "listening" line first).
        doc = json.loads(lines[-1] if lines else "")
    except ValueError as err:
        snippet = text.strip()[:200] or "no output"
        raise ProbeError(f"probe output is not JSON ({snippet})") from err
    if not isinstance(doc, dict) or "probe_version" not in doc:
        raise ProbeError("probe output is not a probe document")
    gpu = _get(doc, "gpu", default={}) or {}
    resolved: dict[str, tuple[str, ...]] = {}
    errors: dict[str, str] = {}
    for name, value in (_get(doc, "resolve", default={}) or {}).items():
        if isinstance(value, list):
            resolved[name] = tuple(str(v) for v in value)
        else:
            errors[name] = str(value).removeprefix("error: ")
    listen = _get(doc, "main_listen", default=None) or {}
    reach = _get(doc, "main_connect", default=None) or {}
    return NodeFacts(
        node=node,
        hostname=str(doc.get("hostname", "")),
        os=str(doc.get("os", "")),
        kernel=str(doc.get("kernel", "")),
        python_requested=_get(doc, "python", "requested"),
        python_found=bool(_get(doc, "python", "found", default=False)),
        python_executable=str(_get(doc, "python", "executable", default="")),
        python_version=str(_get(doc, "python", "version", default="")),
        packages=dict(doc.get("packages") or {}),
        torch_cuda=doc.get("torch_cuda"),
        nvidia_smi=str(gpu.get("status", "absent")),
        gpus=tuple(
            GpuInfo(
                index=str(g.get("index", "")),
                name=str(g.get("name", "")),
                driver=str(g.get("driver", "")),
                memory_used_mib=str(g.get("memory_used_mib", "")),
                uuid=str(g.get("uuid", "")),
            )
            for g in gpu.get("gpus", [])
        ),
        gpu_busy_pids=tuple(str(b.get("pid", "")) for b in gpu.get("busy", [])),
        disk_path=_get(doc, "disk", "path"),
        disk_free_bytes=_get(doc, "disk", "free_bytes"),
        workdir=_get(doc, "workdir", "path"),
        workdir_exists=bool(_get(doc, "workdir", "exists", default=False)),
        script=_get(doc, "script", "path"),
        script_exists=_get(doc, "script", "exists"),
        script_sha256=_get(doc, "script", "sha256"),
        interfaces={k: tuple(v) for k, v in (doc.get("interfaces") or {}).items()},
        ib_devices=tuple(doc.get("ib_devices") or ()),
        resolved=resolved,
        resolve_errors=errors,
        nccl_env=dict(doc.get("nccl_env") or {}),
        port=listen.get("port"),
        port_free=listen.get("free"),
        port_error=listen.get("error"),
        peers=tuple((p.get("hostname"), str(p.get("address"))) for p in listen.get("peers", [])),
        hostnames={
            name: tuple(value) if isinstance(value, list) else str(value).removeprefix("error: ")
            for name, value in (listen.get("hostnames") or {}).items()
        },
        main_reached=reach.get("ok"),
        main_error=reach.get("error"),
        py_spy=_get(doc, "stacks", "py_spy"),
        ptrace_scope=_get(doc, "stacks", "ptrace_scope"),
        root=bool(_get(doc, "stacks", "root", default=False)),
        cap_sys_ptrace=bool(_get(doc, "stacks", "cap_sys_ptrace", default=False)),
        stacks_probed="stacks" in doc,
        own_dirs=_own_dirs(doc.get("own_dirs")),
        environment=parse_environment(doc.get("environment")),
    )
