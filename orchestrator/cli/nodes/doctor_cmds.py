"""`orch doctor`: pre-flight checks of every node, with a fix for every finding."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.table import Table

from orchestrator.checks.model import DoctorReport, EnvironmentParity, Finding
from orchestrator.checks.node import check_accelerate_config
from orchestrator.checks.request import PreflightRequest
from orchestrator.checks.slurm import ssh_inside_allocation
from orchestrator.cli.app import app
from orchestrator.cli.documents import err_console, print_document
from orchestrator.cli.nodes.progress import node_progress
from orchestrator.cli.options import (
    EXCLUDE,
    INCLUDE,
    NODES_PANEL,
    OUTPUT_PANEL,
    SLURM,
    TRANSPORT,
    examples,
    in_panel,
)
from orchestrator.cli.user_defaults import (
    default_hostfile,
    default_python,
    read_defaults,
    say_defaults,
)
from orchestrator.errors import InputFileError
from orchestrator.specs.constants import DEFAULT_MAIN_PORT
from orchestrator.specs.inventory import filter_hosts, nodes_text, read_hostfile
from orchestrator.specs.options import check_port
from orchestrator.specs.slurm import job_inventory
from orchestrator.specs.units import format_bytes

FINGERPRINT_SHOWN = 8  # hex digits of an environment's fingerprint in a table
ENV_ROWS_SHOWN = 20  # rows of packages that differ, the most important first
PACKAGES_PER_ROW = 6  # packages named in one row that differ the same way
_STYLE = {"ok": "[green]ok[/]", "warning": "[yellow]warn[/]", "error": "[bold red]FAIL[/]"}


def _accelerate_findings(path: Path | None) -> list[Finding]:
    if path is None:
        return []
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as err:
        raise InputFileError(str(path), f"cannot read ({err.strerror})") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise InputFileError(str(path), f"not valid YAML ({err})", line) from err
    if not isinstance(loaded, dict):
        raise InputFileError(str(path), "not an accelerate config (expected a mapping)")
    return check_accelerate_config(loaded, str(path))


def _node_table(report: DoctorReport, reached_by: str) -> Table:
    groups = list(report.nodes[0].groups) if report.nodes else []
    table = Table(title="orch doctor", title_justify="left")
    table.add_column("node", style="bold")
    for group in groups:  # the ssh column says how the node was reached: ssh, or srun
        table.add_column(reached_by if group == "ssh" else group)
    for column in ("python / torch", "env", "gpus", "free"):
        table.add_column(column, style="dim")
    for node in report.nodes:
        facts = node.facts
        details = ["", "", "", ""]
        if facts is not None:
            env = facts.environment
            details = [
                f"{facts.python_version} / {facts.packages.get('torch') or '-'}",
                env.fingerprint[:FINGERPRINT_SHOWN]
                if env is not None and facts.python_found
                else "-",
                str(facts.gpu_count) + (f" x {facts.gpu_model}" if facts.gpu_model else ""),
                format_bytes(facts.disk_free_bytes) if facts.disk_free_bytes is not None else "?",
            ]
        cells = [_STYLE.get(node.groups[g], "-") for g in groups]
        table.add_row(node.node, *cells, *details)
    return table


def _findings_table(findings: tuple[Finding, ...]) -> Table:
    table = Table(title="findings", title_justify="left", show_lines=True)
    table.add_column("node", style="bold", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("problem")
    table.add_column("fix", style="cyan")
    for f in sorted(findings, key=lambda f: (f.severity != "error", f.node)):
        mark = "[bold red]error[/]" if f.severity == "error" else "[yellow]warning[/]"
        table.add_row(f.node, f"{f.check} {mark}", f.problem, f.fix)
    return table


def _parity_table(report: DoctorReport) -> Table:
    table = Table(title="parity (values that differ between nodes)", title_justify="left")
    table.add_column("fact", style="bold")
    table.add_column("most nodes")
    table.add_column("differing nodes")
    for row in report.parity:
        by_value: dict[str, list[str]] = {}
        for node, value in row.differing:
            by_value.setdefault(value, []).append(node)
        where = "; ".join(f"{v} on {nodes_text(n)}" for v, n in by_value.items())
        table.add_row(row.fact, row.majority, where)
    return table


def _environment_table(parity: EnvironmentParity) -> Table:
    """The packages that differ, grouped, the most important first."""
    table = Table(title=f"environment: what differs from {parity.reference}'s",
                  title_justify="left")  # fmt: skip
    table.add_column("package", style="bold")
    table.add_column("kind", no_wrap=True)
    table.add_column("where it differs (nodes folded)")
    rows = _same_difference_rows(parity)
    for packages, kind, where in rows[:ENV_ROWS_SHOWN]:
        shown = ", ".join(packages[:PACKAGES_PER_ROW])
        if len(packages) > PACKAGES_PER_ROW:
            shown += f" and {len(packages) - PACKAGES_PER_ROW} more"
        table.add_row(shown, kind if kind == "other" else f"[bold red]{kind}[/]", where)
    hidden = sum(len(packages) for packages, _, _ in rows[ENV_ROWS_SHOWN:])
    if hidden:
        table.add_row("...", "", f"{hidden} more differ (`orch doctor --json` lists them all)")
    return table


def _same_difference_rows(parity: EnvironmentParity) -> list[tuple[list[str], str, str]]:
    """One row per (kind, where it differs): a node that differs in 40 packages the same
    way is one row, as `clush -b` folds identical output."""
    rows: dict[tuple[str, str], list[str]] = {}
    for diff in parity.differences:
        where = diff.describe(parity.reference, nodes_text)
        rows.setdefault((diff.kind, where), []).append(diff.item)
    return [(packages, kind, where) for (kind, where), packages in rows.items()]


def _fingerprints_line(parity: EnvironmentParity) -> str:
    groups = parity.fingerprint_groups()
    prints = "; ".join(f"{p[:FINGERPRINT_SHOWN]} on {nodes_text(w)}" for p, w in groups)
    return f"environment fingerprints (reference: {parity.reference}): {prints}"


def print_report(report: DoctorReport, console: Console, reached_by: str = "ssh") -> None:
    console.print(_node_table(report, reached_by))
    if report.parity:
        console.print(_parity_table(report))
    if report.environment is not None:
        console.print(_fingerprints_line(report.environment))
        if report.environment.differences:
            console.print(_environment_table(report.environment))
    if report.deep:
        deep = Table(title="all_reduce (--deep)", title_justify="left")
        for column in ("node", "backend", "transport", "bus bandwidth", "result"):
            deep.add_column(column)
        for r in report.deep:
            bandwidth = f"{r.bus_bandwidth_mbps:.0f} MB/s" if r.bus_bandwidth_mbps else "-"
            deep.add_row(r.node, r.backend or "-", r.transport or "-", bandwidth,
                         "[green]ok[/]" if r.ok else f"[red]{r.error}[/]")  # fmt: skip
        console.print(deep)
    if report.main_port is not None:
        console.print(f"main port: {report.main_address}:{report.main_port}")
    if report.shared_interfaces and "NCCL_SOCKET_IFNAME" not in os.environ:
        console.print(
            "interfaces every node has (for NCCL_SOCKET_IFNAME): "
            + ", ".join(report.shared_interfaces)
        )
    if report.findings:
        console.print(_findings_table(report.findings))
    errors = len(report.errors)
    warnings = len(report.findings) - errors
    took = f" in {report.seconds:.1f}s" if report.seconds is not None else ""
    if report.ok:
        extra = f" ({warnings} warning(s))" if warnings else ""
        console.print(f"[green]all checks passed on {len(report.nodes)} node(s)[/]{extra}{took}")
    else:
        console.print(
            f"[bold red]{errors} problem(s)[/], {warnings} warning(s) "
            f"on {len(report.nodes)} node(s){took}"
        )


_CHECKS_PANEL = "What to check"
_CONNECT_PANEL = "Reaching the nodes"
_HOSTFILE = typer.Option(
    None,
    "--hostfile",
    "-H",
    help="DeepSpeed hostfile (`host slots=N`; default: ORCH_HOSTFILE, else a defaults file's).",
    rich_help_panel=NODES_PANEL,
)
_ACCELERATE_CONFIG = typer.Option(
    None, "--accelerate-config", help="Also check this accelerate config file.",
    rich_help_panel=_CHECKS_PANEL,
)  # fmt: skip


def _say(text: str) -> None:
    err_console().print(text, markup=False)


@app.command(
    "doctor",
    epilog=examples(
        "# every node of the hostfile, and the script each will run",
        "orch doctor -H hostfile --script train.py",
        "# also an all_reduce across the nodes",
        "orch doctor -H hostfile --deep",
        "# inside a Slurm allocation, as JSON",
        "orch doctor --slurm --json",
    ),
)
def doctor(
    hostfile: Path | None = _HOSTFILE,
    slurm: bool = in_panel(SLURM, NODES_PANEL),
    include: str | None = in_panel(INCLUDE, NODES_PANEL),
    exclude: str | None = in_panel(EXCLUDE, NODES_PANEL),
    script: str = typer.Option(
        None, "--script", help="Training script to look for.", rich_help_panel=_CHECKS_PANEL
    ),
    python: str | None = typer.Option(
        None,
        "--python",
        help="Interpreter the job runs with on every node (default: a defaults file's, else "
        "the head's).",
        rich_help_panel=_CHECKS_PANEL,
    ),
    workdir: str = typer.Option(
        None,
        "--workdir",
        help="Working directory of the job (default: the current one).",
        rich_help_panel=_CHECKS_PANEL,
    ),
    main_port: int | None = typer.Option(
        None,
        "--main-port",
        help="Rendezvous port on node 0 to check (default: one free there, as launch picks).",
        rich_help_panel=_CHECKS_PANEL,
    ),
    main_address: str = typer.Option(
        None,
        "--main-address",
        help="Address the nodes reach node 0 at (default: its name).",
        rich_help_panel=_CHECKS_PANEL,
    ),
    accelerate_config: Path | None = _ACCELERATE_CONFIG,
    deep: bool = typer.Option(
        False,
        "--deep",
        help="Also run an all_reduce across the nodes.",
        rich_help_panel=_CHECKS_PANEL,
    ),
    transport_name: str | None = in_panel(TRANSPORT, _CONNECT_PANEL),
    timeout: float = typer.Option(
        10.0,
        "--timeout",
        help="Seconds for a node to answer (connect, key exchange, auth).",
        rich_help_panel=_CONNECT_PANEL,
    ),
    probe_timeout: float = typer.Option(
        120.0,
        "--probe-timeout",
        help="Seconds for the probe on a node that answered.",
        rich_help_panel=_CONNECT_PANEL,
    ),
    accept_new_host_keys: bool = typer.Option(
        False,
        "--accept-new-host-keys",
        help="Record host keys never seen before (as OpenSSH accept-new); changed keys still fail.",
        rich_help_panel=_CONNECT_PANEL,
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON document.", rich_help_panel=OUTPUT_PANEL
    ),
) -> None:
    """Check every node: SSH, environment parity, files, network, GPUs, disk.

    Exit codes: 0 every check passed (warnings alone pass); 1 a check failed; 2 a usage
    error."""
    from orchestrator.errors import UsageError
    from orchestrator.nodes.transport import SSH, choose_transport
    from orchestrator.prepare.ports import free_port_on
    from orchestrator.prepare.preflight import run_preflight
    from orchestrator.prepare.push_env import push_fix

    if timeout <= 0:
        raise UsageError("--timeout must be positive", "for example --timeout 10")
    said: list[str] = []
    defaults = read_defaults()
    hostfile = default_hostfile(defaults, hostfile, slurm=slurm, said=said)
    python = default_python(defaults, python, said=said) or sys.executable
    say_defaults(said)
    if main_port is not None:
        check_port(main_port, "--main-port")
    given = read_hostfile(hostfile) if hostfile is not None else None
    inventory, allocation = job_inventory(given, slurm=slurm, environ=os.environ)
    hosts = filter_hosts(inventory, include=include, exclude=exclude)
    transport = choose_transport(
        transport_name, slurm_job=allocation.job_id if allocation else "",
        first_node=hosts.names[0] if hosts.names else "", say=_say,
        accept_new_host_keys=accept_new_host_keys,
    )  # fmt: skip
    chosen = main_port is None and bool(hosts.names)
    if chosen:  # the kind of port a launch would pick
        main_port = free_port_on(hosts.names[0], python, transport)
        chosen = main_port is not None
    port = main_port if main_port is not None else DEFAULT_MAIN_PORT
    extra = _accelerate_findings(accelerate_config)
    in_allocation = hostfile is None and allocation is not None
    push = push_fix(python, hostfile=None if hostfile is None else str(hostfile),
                    slurm=in_allocation, include=include, exclude=exclude)  # fmt: skip
    request = PreflightRequest(hosts, python=python, workdir=workdir or os.getcwd(),
                               script=script, main_port=port, main_port_chosen=chosen,
                               main_address=main_address,
                               push=push, extra_findings=tuple(extra))  # fmt: skip
    with node_progress(len(hosts.names), "checking nodes") as on_node:
        report = run_preflight(
            request,
            timeout=timeout,
            probe_timeout=probe_timeout,
            full=deep,
            accept_new_host_keys=accept_new_host_keys,
            on_node=on_node,
            transport=transport,
        )
    if allocation is not None and transport.kind == SSH:
        findings = ssh_inside_allocation(report.findings, allocation.job_id)
        report = replace(report, findings=findings)
    if as_json:
        print_document("doctor", {**report.to_dict(), "transport": transport.kind})
    else:
        # Piped output keeps whole rows rather than rich's 80-column default.
        width = None if sys.stdout.isatty() else 160
        reached_by = "srun" if transport.kind == "slurm" else "ssh"
        print_report(report, Console(highlight=False, width=width), reached_by)
    raise typer.Exit(0 if report.ok else 1)
