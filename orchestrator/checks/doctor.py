"""Pre-flight checks over collected facts: pure functions from facts to findings.

Every finding names the node, says what is wrong and how to fix it. Nothing
here talks to a node: `orchestrator.run.preflight` gathers the facts (SSH, the
probe with its main-port test, the collective) and calls `build_report`.
`run_preflight` is re-exported here, imported lazily so that importing this
module stays free of SSH code.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.probe.facts import NodeFacts
from orchestrator.specs.jobenv import redact

if TYPE_CHECKING:
    from orchestrator.specs.inventory import Hostfile

Severity = Literal["error", "warning"]
CHECK_GROUPS = ("ssh", "python", "files", "parity", "network", "gpu", "disk")
CLUSTER = "*"  # the node of a finding about the whole cluster or a file
GIB = 1 << 30
DISK_ERROR_BYTES = 1 * GIB
DISK_WARNING_BYTES = 5 * GIB
_DEBIAN_HOSTNAME_TRAP = ("127.0.0.1", "127.0.1.1")


@dataclass(frozen=True)
class Finding:
    node: str
    check: str
    problem: str
    fix: str
    severity: Severity = "error"


@dataclass(frozen=True)
class NodeError:
    """Why a node gave no facts: an SSH failure kind, or "probe"."""

    kind: str
    message: str
    hint: str


@dataclass(frozen=True)
class NodeProbe:
    node: str
    facts: NodeFacts | None
    error: NodeError | None = None


@dataclass(frozen=True)
class ParityRow:
    fact: str
    majority: str
    differing: tuple[tuple[str, str], ...]  # (node, its value)


@dataclass(frozen=True)
class CollectiveResult:
    node: str
    ok: bool
    backend: str = ""
    seconds: float | None = None
    bus_bandwidth_mbps: float | None = None
    transport: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class NodeStatus:
    node: str
    reachable: bool
    facts: NodeFacts | None
    groups: Mapping[str, str]  # check group -> "ok" | "warning" | "error" | "-"


@dataclass(frozen=True)
class DoctorReport:
    nodes: tuple[NodeStatus, ...]
    findings: tuple[Finding, ...]
    parity: tuple[ParityRow, ...] = ()
    shared_interfaces: tuple[str, ...] = ()
    deep: tuple[CollectiveResult, ...] = ()
    main_port: int | None = None
    main_address: str | None = None
    seconds: float | None = None  # how long gathering the facts took

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "main": {"address": self.main_address, "port": self.main_port},
            "nodes": [
                {
                    "node": n.node,
                    "reachable": n.reachable,
                    "checks": dict(n.groups),
                    "facts": _facts_dict(n.facts),
                }
                for n in self.nodes
            ],
            "findings": [asdict(f) for f in self.findings],
            "parity": [
                {
                    "fact": row.fact,
                    "majority": row.majority,
                    "differing": [{"node": n, "value": v} for n, v in row.differing],
                }
                for row in self.parity
            ],
            "shared_interfaces": list(self.shared_interfaces),
            "deep": [asdict(r) for r in self.deep],
        }


def _facts_dict(facts: NodeFacts | None) -> dict[str, Any] | None:
    if facts is None:
        return None
    doc = asdict(facts)
    doc["packages"] = dict(facts.packages)
    doc["interfaces"] = {k: list(v) for k, v in facts.interfaces.items()}
    doc["resolved"] = {k: list(v) for k, v in facts.resolved.items()}
    doc["nccl_env"] = redact(facts.nccl_env)  # what is printed or saved never holds secrets
    return doc


# ----- reachability and the probe itself ---------------------------------------------
def check_reachability(probes: Sequence[NodeProbe]) -> list[Finding]:
    findings = []
    for probe in probes:
        if probe.error is not None:
            group = "python" if probe.error.kind == "probe" else "ssh"
            findings.append(Finding(probe.node, group, probe.error.message, probe.error.hint))
    return findings


def _with_facts(probes: Sequence[NodeProbe]) -> list[NodeFacts]:
    return [p.facts for p in probes if p.facts is not None]


# ----- interpreter, files, known traps ------------------------------------------------------
def check_interpreter(probes: Sequence[NodeProbe], python: str) -> list[Finding]:
    findings = []
    for facts in _with_facts(probes):
        if not facts.python_found:
            findings.append(
                Finding(
                    facts.node,
                    "python",
                    f"the job's interpreter {python} does not exist on {facts.node} "
                    f"(the probe fell back to {facts.python_executable})",
                    f"create the same environment at {python} on {facts.node} "
                    "(same path on every node), or pass --python with a path valid everywhere",
                )
            )
        elif facts.packages.get("torch") is None:
            findings.append(
                Finding(
                    facts.node,
                    "python",
                    f"torch is not installed for {python} on {facts.node}",
                    f"on {facts.node}: `{shlex.quote(python)} -m pip install torch` "
                    "(the same version as the other nodes)",
                )
            )
    return findings


def check_known_traps(probes: Sequence[NodeProbe], python: str) -> list[Finding]:
    findings = []
    for facts in _with_facts(probes):
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
    for facts in _with_facts(probes):
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


# ----- parity --------------------------------------------------------------------------
@dataclass(frozen=True)
class ParityFact:
    name: str
    value: Callable[[NodeFacts], str | None]
    severity: Severity
    fix: str  # format with {node}, {value}, {python}, {package}
    needs_interpreter: bool = True


def _pkg(name: str) -> Callable[[NodeFacts], str | None]:
    return lambda f: f.packages.get(name)


_PIP_FIX = "on {node}: `{python} -m pip install {package}=={value}`"
PARITY_FACTS: tuple[ParityFact, ...] = (
    ParityFact("python", lambda f: f.python_version, "error",
               "install Python {value} at the job's interpreter path on {node}"),
    ParityFact("torch", _pkg("torch"), "error", _PIP_FIX),
    ParityFact("cuda (torch build)", lambda f: f.torch_cuda, "error",
               "install the torch build for CUDA {value} on {node}"),
    ParityFact("nccl", _pkg("nccl"), "error", "install the NCCL {value} wheel on {node}"),
    ParityFact("deepspeed", _pkg("deepspeed"), "error", _PIP_FIX),
    ParityFact("accelerate", _pkg("accelerate"), "error", _PIP_FIX),
    ParityFact("transformers", _pkg("transformers"), "error", _PIP_FIX),
    ParityFact("colossalai", _pkg("colossalai"), "error", _PIP_FIX),
    ParityFact("gpu count", lambda f: str(f.gpu_count), "error",
               "check {node}'s GPUs with `nvidia-smi` (a GPU missing or fallen off the bus?)",
               needs_interpreter=False),
    ParityFact("gpu model", lambda f: f.gpu_model, "error",
               "use nodes with the same GPU model, or expect the slowest to set the pace",
               needs_interpreter=False),
    ParityFact("driver", lambda f: f.driver, "warning",
               "install NVIDIA driver {value} on {node}", needs_interpreter=False),
    ParityFact("os", lambda f: f.os, "warning", "run the same OS release on every node",
               needs_interpreter=False),
    ParityFact("script sha256", lambda f: f.script_sha256, "error",
               "copy the same script to {node} (or use a shared filesystem)",
               needs_interpreter=False),
)  # fmt: skip


def _show(value: str | None) -> str:
    return "missing" if value is None else value


def majority_value(values: Sequence[str | None]) -> str | None:
    """The most common value; a tie goes to the earliest (node 0 first)."""
    counts = Counter(values)
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def check_parity(probes: Sequence[NodeProbe], python: str) -> tuple[list[ParityRow], list[Finding]]:
    facts = _with_facts(probes)
    rows: list[ParityRow] = []
    findings: list[Finding] = []
    if len(facts) < 2:
        return rows, findings
    for fact in PARITY_FACTS:
        # Nodes without the job's interpreter are reported by check_interpreter;
        # what the fallback interpreter has says nothing about the job's.
        usable = [(f, fact.value(f)) for f in facts if f.python_found or not fact.needs_interpreter]
        if len({v for _, v in usable}) <= 1:
            continue
        majority = majority_value([v for _, v in usable])
        differing = tuple((f.node, _show(v)) for f, v in usable if v != majority)
        rows.append(ParityRow(fact.name, _show(majority), differing))
        for node, value in differing:
            fix = fact.fix.format(
                node=node, value=_show(majority), python=shlex.quote(python), package=fact.name
            )
            if majority is None:
                fix = f"remove {fact.name} from {node}, or install it on every node"
            findings.append(
                Finding(
                    node,
                    "parity",
                    f"{fact.name} is {value} on {node}, but {_show(majority)} on most nodes",
                    fix,
                    fact.severity,
                )
            )
    return rows, findings


# ----- network --------------------------------------------------------------------------
def check_resolution(probes: Sequence[NodeProbe], names: Sequence[str]) -> list[Finding]:
    """Every node resolves every hostfile name, all to the same addresses."""
    facts = _with_facts(probes)
    findings: list[Finding] = []
    main = names[0] if names else None
    for f in facts:
        for name, error in f.resolve_errors.items():
            severity: Severity = "error" if name == main else "warning"
            why = " (it is the main node: ranks rendezvous there)" if name == main else ""
            findings.append(
                Finding(
                    f.node,
                    "network",
                    f"{f.node} cannot resolve {name}{why}: {error}",
                    f"add `<address> {name}` to /etc/hosts on {f.node}, or fix DNS",
                    severity,
                )
            )
    for name in names:
        seen = [(f.node, f.resolved[name]) for f in facts if name in f.resolved]
        if len({addrs for _, addrs in seen}) > 1:
            majority = majority_value([addrs for _, addrs in seen])
            for node, addrs in seen:
                if addrs != majority:
                    findings.append(
                        Finding(
                            node,
                            "network",
                            f"{node} resolves {name} to {', '.join(addrs)}, most nodes to "
                            f"{', '.join(majority or ())}",
                            f"make /etc/hosts or DNS on {node} agree with the other nodes",
                        )
                    )
        if len(names) > 1:
            for node, addrs in seen:
                trap = sorted(set(addrs) & set(_DEBIAN_HOSTNAME_TRAP))
                if trap:
                    findings.append(
                        Finding(
                            node,
                            "network",
                            f"{node} resolves {name} to {trap[0]}, a loopback address other "
                            "nodes cannot reach (the Debian /etc/hosts hostname line)",
                            f"in /etc/hosts on {node}, map {name} to its network address",
                            "error" if name == main else "warning",
                        )
                    )
    return findings


def check_hostnames(probes: Sequence[NodeProbe]) -> list[Finding]:
    """Each node's own hostname must resolve on node 0 (gloo and NCCL look it up)."""
    main = probes[0].facts if probes else None
    if main is None or not main.hostnames:
        return []
    findings = []
    for f in _with_facts(probes):
        answer = main.hostnames.get(f.hostname)
        if isinstance(answer, str):
            findings.append(
                Finding(
                    f.node,
                    "network",
                    f"{f.node}'s hostname {f.hostname!r} does not resolve on the main node "
                    f"{main.node}: {answer}",
                    f"add `<{f.node}'s address> {f.hostname}` to /etc/hosts on {main.node} "
                    "(and on every node), or fix DNS",
                )
            )
    return findings


def check_main_port(
    probes: Sequence[NodeProbe], address: str | None, port: int | None
) -> list[Finding]:
    """Node 0 could hold the main port, and every other node reached it there."""
    main = probes[0].facts if probes else None
    if main is None or main.port is None:
        return []  # node 0 gave no facts: reported already, nothing to test against
    if not main.port_free:
        return [
            Finding(
                main.node,
                "network",
                f"main port {main.port} is already in use on {main.node} "
                f"({main.port_error or 'in use'})",
                f"stop what listens there (on {main.node}: `ss -ltnp 'sport = :{main.port}'`) "
                "or choose another port with --main-port",
            )
        ]
    findings = []
    for f in _with_facts(probes[1:]):
        if f.main_reached is False:
            findings.append(
                Finding(
                    f.node,
                    "network",
                    f"{f.node} cannot connect to the main node at {address}:{port} "
                    f"({f.main_error or 'no answer'})",
                    f"open TCP port {port} on {main.node} for the other nodes and check routing "
                    f"(on {f.node}: `nc -zv {address} {port}`)",
                )
            )
    return findings


def _iface_rules(value: str) -> tuple[bool, bool, list[str]]:
    """NCCL_SOCKET_IFNAME: '^' excludes, '=' means exact names, else prefixes."""
    exclude = value.startswith("^")
    body = value[1:] if exclude else value
    exact = body.startswith("=")
    body = body[1:] if exact else body
    return exclude, exact, [p for p in body.split(",") if p]


def interfaces_matching(value: str, interfaces: Iterable[str]) -> list[str]:
    exclude, exact, patterns = _iface_rules(value)

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in patterns)

    return [name for name in interfaces if hit(name) != exclude]


def shared_interfaces(probes: Sequence[NodeProbe]) -> tuple[str, ...]:
    """Interfaces with an address on every node, loopback and docker excluded."""
    facts = _with_facts(probes)
    if not facts:
        return ()
    common: set[str] | None = None
    for f in facts:
        names = {n for n, addrs in f.interfaces.items() if addrs}
        common = names if common is None else common & names
    return tuple(sorted(n for n in common or () if n != "lo" and not n.startswith("docker")))


def check_nccl_env(probes: Sequence[NodeProbe], env: Mapping[str, str]) -> list[Finding]:
    findings = []
    ifname = env.get("NCCL_SOCKET_IFNAME")
    ib_disable = env.get("NCCL_IB_DISABLE")
    nccl_net = env.get("NCCL_NET", "")
    hca = env.get("NCCL_IB_HCA")
    for f in _with_facts(probes):
        if ifname:
            usable = [n for n in interfaces_matching(ifname, f.interfaces) if f.interfaces.get(n)]
            if not usable:
                have = ", ".join(n for n, a in f.interfaces.items() if a) or "none"
                findings.append(
                    Finding(
                        f.node,
                        "network",
                        f"NCCL_SOCKET_IFNAME={ifname} matches no interface with an address on "
                        f"{f.node} (it has: {have})",
                        "set NCCL_SOCKET_IFNAME to an interface every node has "
                        "(see the shared interfaces doctor lists)",
                    )
                )
        if not f.ib_devices and nccl_net.upper() == "IB":
            findings.append(
                Finding(
                    f.node,
                    "network",
                    f"NCCL_NET=IB but {f.node} has no InfiniBand device (/sys/class/infiniband)",
                    "unset NCCL_NET, or check the node's IB driver (`ibv_devinfo`)",
                )
            )
        elif not f.ib_devices and ib_disable is not None and ib_disable.strip() == "0":
            findings.append(
                Finding(
                    f.node,
                    "network",
                    f"NCCL_IB_DISABLE=0 but {f.node} has no InfiniBand device: "
                    "NCCL will use sockets",
                    "set NCCL_IB_DISABLE=1 on a cluster without InfiniBand, "
                    "or check the IB driver (`ibv_devinfo`)",
                    "warning",
                )
            )
        if hca and f.ib_devices:
            _, _, wanted = _iface_rules(hca)
            names = [w.split(":")[0] for w in wanted]
            if not any(d.startswith(n) for d in f.ib_devices for n in names):
                findings.append(
                    Finding(
                        f.node,
                        "network",
                        f"NCCL_IB_HCA={hca} names no IB device of {f.node} "
                        f"(it has: {', '.join(f.ib_devices)})",
                        "set NCCL_IB_HCA to devices listed in /sys/class/infiniband",
                        "warning",
                    )
                )
    return findings


# ----- GPUs and disk ---------------------------------------------------------------------
def check_gpus(probes: Sequence[NodeProbe], slots: Mapping[str, int]) -> list[Finding]:
    findings = []
    for f in _with_facts(probes):
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
    for f in _with_facts(probes):
        free = f.disk_free_bytes
        if free is None:
            continue
        if free < DISK_WARNING_BYTES:
            severity: Severity = "error" if free < DISK_ERROR_BYTES else "warning"
            findings.append(
                Finding(
                    f.node,
                    "disk",
                    f"only {free / GIB:.1f} GiB free in {f.disk_path} on {f.node}",
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


# ----- the collective check -----------------------------------------------------------------
_NCCL_VIA = re.compile(r"via (NET/[A-Za-z]+|P2P|SHM|direct)")


def nccl_transport(output: str) -> str | None:
    """The network transport NCCL_DEBUG=INFO says it used (NET/IB, NET/Socket, ...)."""
    found = Counter(m.group(1) for m in _NCCL_VIA.finditer(output))
    net = [t for t in found if t.startswith("NET/")]
    if net:
        return max(net, key=lambda t: found[t])
    match = re.search(r"NCCL INFO Using network (\w+)", output)
    if match:
        return f"NET/{match.group(1)}"
    return found.most_common(1)[0][0] if found else None


def check_collective(
    results: Sequence[CollectiveResult], probes: Sequence[NodeProbe]
) -> list[Finding]:
    findings = []
    ib = {p.node for p in probes if p.facts is not None and p.facts.ib_devices}
    speeds = [r.bus_bandwidth_mbps for r in results if r.ok and r.bus_bandwidth_mbps]
    typical = sorted(speeds)[len(speeds) // 2] if speeds else None
    for r in results:
        if not r.ok:
            findings.append(
                Finding(
                    r.node,
                    "deep",
                    f"all_reduce failed on {r.node}: {r.error}",
                    "check the node's network (firewall between nodes, NCCL_SOCKET_IFNAME) "
                    "and its torch install",
                )
            )
            continue
        if r.transport == "NET/Socket" and r.node in ib:
            findings.append(
                Finding(
                    r.node,
                    "deep",
                    f"NCCL on {r.node} fell back to sockets although it has InfiniBand",
                    "set NCCL_NET=IB (and NCCL_IB_HCA / NCCL_IB_GID_INDEX for RoCE), "
                    "and check NCCL_IB_DISABLE is not 1",
                )
            )
        if typical and r.bus_bandwidth_mbps and r.bus_bandwidth_mbps < typical / 2:
            findings.append(
                Finding(
                    r.node,
                    "deep",
                    f"{r.node} reached {r.bus_bandwidth_mbps:.0f} MB/s in all_reduce, under half "
                    f"the typical {typical:.0f} MB/s",
                    "check its link (speed, errors: `ethtool`, `ibstat`) and NCCL transport",
                    "warning",
                )
            )
    return findings


# ----- the report ---------------------------------------------------------------------------------
def _node_groups(
    probe: NodeProbe, findings: Sequence[Finding], groups: Sequence[str]
) -> dict[str, str]:
    status: dict[str, str] = {}
    mine = [f for f in findings if f.node == probe.node]
    for group in groups:
        in_group = [f for f in mine if f.check == group]
        if any(f.severity == "error" for f in in_group):
            status[group] = "error"
        elif in_group:
            status[group] = "warning"
        elif probe.facts is None and group != "ssh":
            status[group] = "-"
        else:
            status[group] = "ok"
    if probe.error is not None and probe.error.kind != "probe":
        status["ssh"] = "error"
    return status


def build_report(
    hostfile: Hostfile,
    probes: Sequence[NodeProbe],
    *,
    python: str,
    workdir: str | None,
    script: str | None,
    env: Mapping[str, str],
    head_script_sha256: str | None = None,
    main_address: str | None = None,
    main_port: int | None = None,
    deep: Sequence[CollectiveResult] = (),
    extra: Sequence[Finding] = (),
) -> DoctorReport:
    names = list(hostfile.names)
    slots = {h.host: h.slots for h in hostfile.hosts}
    parity_rows, parity_findings = check_parity(probes, python)
    findings = [
        *check_reachability(probes),
        *check_interpreter(probes, python),
        *check_known_traps(probes, python),
        *check_files(probes, workdir=workdir, script=script,
                     head_script_sha256=head_script_sha256),
        *parity_findings,
        *check_resolution(probes, names),
        *check_hostnames(probes),
        *check_main_port(probes, main_address, main_port),
        *check_nccl_env(probes, env),
        *check_gpus(probes, slots),
        *check_disk(probes),
        *check_collective(deep, probes),
        *extra,
    ]  # fmt: skip
    groups = (*CHECK_GROUPS, "deep") if deep else CHECK_GROUPS
    nodes = tuple(
        NodeStatus(p.node, p.error is None or p.error.kind == "probe", p.facts,
                   _node_groups(p, findings, groups))
        for p in probes
    )  # fmt: skip
    return DoctorReport(
        nodes=nodes,
        findings=tuple(findings),
        parity=tuple(parity_rows),
        shared_interfaces=shared_interfaces(probes),
        deep=tuple(deep),
        main_port=main_port,
        main_address=main_address,
    )
