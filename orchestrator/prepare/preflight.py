"""Gathers what doctor checks: probe every node, test the main port, run a collective.

The flow: (1) one probe per node, in parallel over SSH, during which node 0
holds the main port open while every other node connects to it and says its
hostname, which node 0 resolves; (2) with `full`, one all_reduce process per
node. A node that does not answer fails within the connect timeout; one that answered has
the probe timeout to run the probe, so a node that hangs delays the report by at most that.
The checks themselves are the pure functions of `orchestrator.checks`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from orchestrator.checks.collective import nccl_transport
from orchestrator.checks.environment import script_distributions, script_imports
from orchestrator.checks.model import (
    CollectiveResult,
    DoctorReport,
    NodeError,
    NodeProbe,
)
from orchestrator.checks.report import build_report
from orchestrator.checks.request import PreflightRequest
from orchestrator.nodes.transport import NodeTransport, SshTransport
from orchestrator.pernode import NodeResult, failed, succeeded
from orchestrator.probe.commands import (
    ENVIRONMENT_SOURCE,
    collective_command,
    connect_request,
    listen_request,
    probe_command,
)
from orchestrator.probe.facts import (
    Environment,
    ProbeError,
    parse_environment,
    parse_facts,
    parse_listening,
)
from orchestrator.remote import owned
from orchestrator.remote.digest import sha256_of
from orchestrator.specs.constants import DEFAULT_MAIN_PORT
from orchestrator.ssh import CommandResult

PROBE_TIMEOUT_S = 120.0  # the probe's own time on a node that answered
NodeDone = Callable[[str, bool], None]  # (node, probe answered) as each node ends


def _to_probe(outcome: NodeResult[CommandResult]) -> NodeProbe:
    result = outcome.value
    if result is None:
        error = NodeError(outcome.kind or "other", outcome.problem or "", outcome.hint or "")
        return NodeProbe(outcome.node, None, error)
    try:
        return NodeProbe(outcome.node, parse_facts(outcome.node, result.stdout), shell=result.shell)
    except ProbeError as err:
        stderr = result.stderr.decode(errors="replace").strip().splitlines()[-3:]
        detail = " | ".join(stderr) or str(err)
        return NodeProbe(
            outcome.node,
            None,
            NodeError(
                "probe",
                f"{outcome.node}: the probe failed (exit {result.exit_code}): {detail}",
                "check that the node has a working python3 on PATH for its login shell",
            ),
            shell=result.shell,
        )


def probe_nodes(
    names: Sequence[str],
    *,
    python: str,
    workdir: str | None,
    script: str | None,
    main_address: str,
    main_port: int,
    timeout: float,
    probe_timeout: float = 0.0,
    accept_new_host_keys: bool = False,
    on_node: NodeDone | None = None,
    transport: NodeTransport | None = None,
    node_root: str = "",
) -> list[NodeProbe]:
    """Facts from every node, in parallel; meanwhile node 0 holds the main port
    open and every other node connects to it (the network pre-flight). `node_root`: the
    user's ORCH_NODE_ROOT, where each node's probe makes orch's directory.

    Node 0 starts first and says when it is listening; then the others run.
    When they are done, node 0 is told so and reports who reached it. `on_node(node, ok)`
    hears of each node as its probe ends.
    """
    main, others = names[0], list(names[1:])
    transport = transport or SshTransport(accept_new_host_keys=accept_new_host_keys)
    # A node that does not answer fails within `timeout` (connect, banner, key exchange,
    # auth); one that answered gets `probe_timeout` to run the probe: a cold, NFS-mounted
    # Python can take tens of seconds to read its packages' metadata.
    probe_timeout = max(probe_timeout, timeout)

    def command(role: dict[str, object] | None) -> str:  # the same on every node
        return probe_command(
            python, workdir=workdir, script=script, names=names, main=role,
            resolve_timeout=min(3.0, timeout / 2), node_root=node_root,
        )  # fmt: skip

    # Node 0 waits for "done"; the window only bounds it if this process dies.
    listen = listen_request(main_port, peers=len(others), window=2 * probe_timeout + timeout + 10)
    started = transport.start(main, command(listen), timeout=timeout, time_shell=True)
    process = started.value
    main_outcome: NodeResult[CommandResult] | None = None
    if process is None:
        main_outcome = failed(main, started.problem or "", started.hint, started.kind)
    first_line, listening = b"", False
    if process is not None:
        first_line = process.read_line(probe_timeout) or b""
        listening, _ = parse_listening(first_line)
    try:
        connect = connect_request(main_address, main_port, window=max(1.0, min(5.0, timeout / 2)))
        outcomes = transport.run(
            others,
            command(connect if listening else None),
            timeout=probe_timeout,
            connect_timeout=timeout,
            on_result=None if on_node is None else lambda r: on_node(r.node, r.ok),
            time_shell=True,
        )
        if process is not None:
            with contextlib.suppress(OSError, EOFError):
                process.send(b"done\n")
            main_outcome = process.wait(probe_timeout)
            if main_outcome.value is not None:
                value = replace(main_outcome.value, stdout=first_line + main_outcome.value.stdout)
                main_outcome = succeeded(main, value)
    finally:
        if process is not None:
            process.close()
    assert main_outcome is not None
    if on_node is not None:
        on_node(main, main_outcome.ok)
    return [_to_probe(o) for o in [main_outcome, *outcomes]]


def run_collective(
    probes: Sequence[NodeProbe],
    *,
    python: str,
    address: str,
    port: int,
    timeout: float,
    transport: NodeTransport | None = None,
) -> list[CollectiveResult]:
    """Phase 3 (--deep): one all_reduce process per node, rendezvous at node 0."""
    names = [p.node for p in probes]
    if any(p.facts is None for p in probes):
        return [
            CollectiveResult(p.node, False, error="skipped: not every node is reachable")
            for p in probes
        ]
    world = len(names)

    def command(node: str) -> str:
        return collective_command(python, address, port, names.index(node), world, timeout)

    transport = transport or SshTransport()
    outcomes = transport.run(names, command, timeout=timeout + 30, connect_timeout=timeout)
    results = []
    for outcome in outcomes:
        result = outcome.value
        if result is None:
            results.append(CollectiveResult(outcome.node, False, error=outcome.problem))
            continue
        text = result.stdout.decode(errors="replace")
        doc = next(
            (
                json.loads(line.split(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("ORCH-COLLECTIVE ")
            ),
            None,
        )
        if doc is None:
            tail = result.stderr.decode(errors="replace").strip().splitlines()[-2:]
            error = " | ".join(tail) or f"exit {result.exit_code}, no result"
            results.append(CollectiveResult(outcome.node, False, error=error))
            continue
        results.append(
            CollectiveResult(
                outcome.node,
                bool(doc.get("ok")),
                backend=str(doc.get("backend", "")),
                seconds=doc.get("seconds"),
                bus_bandwidth_mbps=doc.get("bus_bandwidth_mbps"),
                transport=nccl_transport(text) if doc.get("backend") == "nccl" else "gloo/tcp",
                error=doc.get("error"),
            )
        )
    return results


def head_environment(python: str, timeout: float = PROBE_TIMEOUT_S) -> Environment | None:
    """The job's interpreter on the head, as a node's probe reports it: the reference of
    environment parity. None when the head has no such interpreter (node 0 is the
    reference then) or it does not answer."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return None
    try:
        done = subprocess.run([python, "-c", ENVIRONMENT_SOURCE], capture_output=True,
                              timeout=timeout, check=False)  # fmt: skip
        return parse_environment(json.loads(done.stdout))
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def script_packages(script: str | None) -> frozenset[str]:
    """The distributions the script imports, as the head's packages provide its modules.
    The head's whole map of modules to distributions (reading every package's file list:
    most of a second with torch) is read only for a module no distribution is named after
    (`yaml`, from PyYAML)."""
    from importlib import metadata

    if not script:
        return frozenset()
    try:
        source = Path(script).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return frozenset()
    modules = {m for m in script_imports(source) if m not in sys.stdlib_module_names}
    unnamed = [m for m in modules if not _named_distribution(m)]
    providers = metadata.packages_distributions() if unnamed else {}
    return script_distributions(modules, providers)


def _named_distribution(module: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(module)
    except metadata.PackageNotFoundError:
        return False
    return True


def _sha256(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return sha256_of(path)
    except OSError:
        return None


def run_preflight(
    request: PreflightRequest,
    *,
    timeout: float = 10.0,
    probe_timeout: float = PROBE_TIMEOUT_S,
    full: bool = False,
    accept_new_host_keys: bool = False,
    on_node: NodeDone | None = None,
    transport: NodeTransport | None = None,
) -> DoctorReport:
    """Every check doctor makes, over every node of the request's hostfile (`full`: the
    collective too).

    What the request leaves open is the head's (as a launch uses them: its interpreter,
    working directory and environment); the main address defaults to node 0's name as the
    hostfile gives it, which is what the other nodes will connect to.
    """
    started = time.monotonic()
    request = request.on_head(python=sys.executable, cwd=os.getcwd(), environ=os.environ)
    python, script = request.python, request.script
    # on_head filled both in; these only say so to the type checker
    address = request.main_address or request.hostfile.names[0]
    port = DEFAULT_MAIN_PORT if request.main_port is None else request.main_port
    with ThreadPoolExecutor(2) as head:  # the head's environment, while the nodes answer
        head_env = head.submit(head_environment, python, probe_timeout)
        imports = head.submit(script_packages, script)
        probes = probe_nodes(
            list(request.hostfile.names),
            python=python,
            workdir=request.workdir,
            script=script,
            main_address=address,
            main_port=port,
            timeout=timeout,
            probe_timeout=probe_timeout,
            accept_new_host_keys=accept_new_host_keys,
            on_node=on_node,
            transport=transport,
            node_root=owned.root_setting(os.environ),
        )
    deep: list[CollectiveResult] = []
    if full:
        deep = run_collective(probes, python=python, address=address, port=port,
                              timeout=max(timeout, 30.0), transport=transport)  # fmt: skip
    report = build_report(
        request,
        probes,
        head_script_sha256=_sha256(script),
        deep=deep,
        head_environment=head_env.result(),
        script_packages=imports.result(),
    )
    return replace(report, seconds=time.monotonic() - started)
