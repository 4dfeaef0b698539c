"""The doctor's report: every family of checks run over the probes, grouped per node.
Pure: `orchestrator.prepare.preflight` gathers the facts and calls `build_report`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.checks.collective import check_collective
from orchestrator.checks.environment import environment_findings, environment_parity
from orchestrator.checks.model import (
    CHECK_GROUPS,
    CollectiveResult,
    DoctorReport,
    Finding,
    NodeCheckStatus,
    NodeProbe,
    with_facts,
)
from orchestrator.checks.network import (
    check_hostnames,
    check_main_port,
    check_nccl_env,
    check_resolution,
    shared_interfaces,
)
from orchestrator.checks.node import (
    check_disk,
    check_files,
    check_gpus,
    check_interpreter,
    check_known_traps,
    check_own_directories,
    check_reachability,
    check_shell,
    check_stacks,
)
from orchestrator.checks.parity import check_parity
from orchestrator.checks.request import PreflightRequest

if TYPE_CHECKING:
    from orchestrator.probe.facts import Environment


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
    request: PreflightRequest,
    probes: Sequence[NodeProbe],
    *,
    head_script_sha256: str | None = None,
    deep: Sequence[CollectiveResult] = (),
    head_environment: Environment | None = None,
    script_packages: frozenset[str] = frozenset(),
) -> DoctorReport:
    """The findings on what was gathered for `request` (its fields as they are: run_preflight
    passes it filled in on the head). head_environment: the job's interpreter on the head
    (None: the head has no such path; node 0 is the reference then); script_packages: the
    distributions the script imports, compared right after the launchers' packages."""
    hostfile, python, push = request.hostfile, request.python, request.push
    workdir, script = request.workdir, request.script
    main_address, main_port = request.main_address, request.main_port
    names = list(hostfile.names)
    slots = {h.host: h.slots for h in hostfile.hosts}
    parity_rows, parity_findings = check_parity(probes, python)
    environment = environment_parity(with_facts(probes), head_environment, script_packages)
    findings = [
        *check_reachability(probes),
        *check_shell(probes),
        *check_interpreter(probes, python, push),
        *check_known_traps(probes, python),
        *check_own_directories(probes),
        *check_files(probes, workdir=workdir, script=script,
                     head_script_sha256=head_script_sha256),
        *environment_findings(environment, python, push),
        *parity_findings,
        *check_resolution(probes, names),
        *check_hostnames(probes),
        *check_main_port(probes, main_address, main_port, request.main_port_chosen),
        *check_nccl_env(probes, request.env or {}),
        *check_gpus(probes, slots),
        *check_disk(probes),
        *check_stacks(probes, python),
        *check_collective(deep, probes),
        *request.extra_findings,
    ]  # fmt: skip
    groups = (*CHECK_GROUPS, "deep") if deep else CHECK_GROUPS
    nodes = tuple(
        NodeCheckStatus(p.node, p.error is None or p.error.kind == "probe", p.facts,
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
        environment=environment,
        head_fingerprint=head_environment.fingerprint if head_environment is not None else None,
    )
