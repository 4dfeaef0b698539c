"""Doctor's checks over facts: pure functions, tested on values."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from _doctor_facts import ADDRS, NAMES, PY, facts

from orchestrator.checks.collective import check_collective, nccl_transport
from orchestrator.checks.environment import PushFix
from orchestrator.checks.model import CollectiveResult, NodeError, NodeProbe
from orchestrator.checks.network import (
    check_hostnames,
    check_main_port,
    check_nccl_env,
    check_resolution,
    interfaces_matching,
    shared_interfaces,
)
from orchestrator.checks.node import (
    check_accelerate_config,
    check_disk,
    check_files,
    check_gpus,
    check_interpreter,
    check_known_traps,
    check_own_directories,
    check_stacks,
)
from orchestrator.checks.parity import check_parity, majority_value
from orchestrator.checks.report import build_report
from orchestrator.checks.request import PreflightRequest
from orchestrator.probe.facts import GpuInfo, NodeFacts, OwnDirectory
from orchestrator.specs.inventory import parse_hostfile


def probes(*items: NodeFacts) -> list[NodeProbe]:
    return [NodeProbe(f.node, f) for f in items]


def cluster(**per_node: dict[str, object]) -> list[NodeProbe]:
    return probes(*(facts(n, **per_node.get(n, {})) for n in NAMES))


def test_identical_nodes_give_no_findings() -> None:
    hostfile = parse_hostfile("n1 slots=2\nn2 slots=2\nn3 slots=2\n")
    request = PreflightRequest(hostfile, python=PY, workdir="/work", script="/work/train.py",
                               env={})  # fmt: skip
    report = build_report(request, cluster())
    assert report.ok
    assert report.findings == ()
    assert [n.groups["ssh"] for n in report.nodes] == ["ok", "ok", "ok"]
    assert report.shared_interfaces == ("eth0",)


def test_parity_table_names_the_differing_node_and_the_majority() -> None:
    rows, found = check_parity(cluster(n3={"torch_cuda": "12.1"}), PY)
    assert [(r.fact, r.majority, r.differing) for r in rows] == [
        ("cuda (torch build)", "missing", (("n3", "12.1"),))
    ]
    assert len(found) == 1
    assert found[0].node == "n3" and found[0].check == "parity"
    assert "cuda (torch build) is 12.1 on n3, but missing on most nodes" in found[0].problem


def test_parity_tie_goes_to_node_zero() -> None:
    assert majority_value(["a", "b"]) == "a"
    assert majority_value(["b", "a", "a"]) == "a"
    two = probes(facts("n1", torch_cuda="12.1"), facts("n2", torch_cuda="12.4"))
    rows, _ = check_parity(two, PY)
    assert rows[0].majority == "12.1" and rows[0].differing == (("n2", "12.4"),)


def test_parity_skips_interpreter_facts_of_a_node_without_the_interpreter() -> None:
    # The fallback interpreter's torch says nothing about the job's environment.
    missing = {"python_found": False, "packages": {}, "torch_cuda": "11.8"}
    rows, _ = check_parity(cluster(n2=missing), PY)
    assert rows == []
    found = check_interpreter(cluster(n2=missing), PY)
    assert [(f.node, f.check) for f in found] == [("n2", "python")]
    assert f"interpreter {PY} does not exist on n2" in found[0].problem
    assert "push" not in found[0].fix


def test_a_missing_environment_names_the_push_of_the_heads() -> None:
    missing = {"python_found": False, "packages": {}}
    push = PushFix(f"orch env push --hostfile hf --python {PY}", option=True)
    [found] = check_interpreter(cluster(n2=missing), PY, push)
    assert found.fix.endswith(
        f"; or copy the head's environment: `orch env push --hostfile hf --python {PY}`, or "
        "launch again with --push-env"
    )


def test_driver_differences_are_warnings() -> None:
    gpu = GpuInfo("0", "H100", "550.54", "0", "GPU-1")
    rows, found = check_parity(
        cluster(n1={"gpus": (gpu,)}, n2={"gpus": (replace(gpu, driver="535.1"),)},
                n3={"gpus": (gpu,)}), PY)  # fmt: skip
    assert rows[0].fact == "driver"
    assert found[0].severity == "warning"


def test_torch_missing_everywhere_is_an_error_on_each_node() -> None:
    no_torch = {"packages": {"accelerate": "1.15.0"}}
    found = check_interpreter(cluster(n1=no_torch, n2=no_torch, n3=no_torch), PY)
    assert [f.node for f in found] == NAMES
    assert "torch is not installed" in found[0].problem


def test_deepspeed_without_transformers_is_the_known_trap() -> None:
    pkgs = {"torch": "2.13.0", "accelerate": "1.15.0", "deepspeed": "0.19.8"}
    found = check_known_traps(cluster(n1={"packages": pkgs}), PY)
    assert [f.node for f in found] == ["n1"]
    assert "no transformers" in found[0].problem
    assert "pip install transformers" in found[0].fix


def test_missing_workdir_and_script_name_the_path() -> None:
    found = check_files(
        cluster(n2={"workdir_exists": False}, n3={"script_exists": False, "script_sha256": None}),
        workdir="/work",
        script="/work/train.py",
    )
    assert [(f.node, f.problem) for f in found] == [
        ("n2", "working directory /work does not exist on n2"),
        ("n3", "script /work/train.py does not exist on n3"),
    ]


def test_script_differing_from_the_head_copy() -> None:
    found = check_files(
        cluster(n2={"script_sha256": "b" * 64}),
        workdir="/work",
        script="/work/train.py",
        head_script_sha256="a" * 64,
    )
    assert [f.node for f in found] == ["n2"]
    assert "differs from this machine's copy" in found[0].problem


def test_unresolvable_main_node_is_an_error_other_names_a_warning() -> None:
    broken = {
        "resolved": {"n2": ADDRS["n2"]},
        "resolve_errors": {"n1": "not known", "n3": "not known"},
    }
    found = check_resolution(cluster(n2=broken), NAMES)
    by_name = {f.problem.split("resolve ")[1].split(":")[0].split(" ")[0]: f for f in found}
    assert by_name["n1"].severity == "error" and "main node" in by_name["n1"].problem
    assert by_name["n3"].severity == "warning"
    assert all(f.node == "n2" for f in found)


def test_a_node_resolving_a_name_differently_is_named() -> None:
    other = dict(ADDRS, n3=("10.9.9.9",))
    found = check_resolution(cluster(n1={"resolved": other}), NAMES)
    assert [(f.node, f.severity) for f in found] == [("n1", "error")]
    assert "resolves n3 to 10.9.9.9, most nodes to 10.0.0.3" in found[0].problem


def test_debian_loopback_hostname_line_is_flagged() -> None:
    trap = dict(ADDRS, n1=("127.0.1.1",))
    found = check_resolution(cluster(n1={"resolved": trap}), NAMES)
    assert any("127.0.1.1" in f.problem and f.severity == "error" for f in found)


def test_hostname_not_resolvable_on_node_zero() -> None:
    main = {"hostnames": {"n1": ("10.0.0.1",), "n2": ("10.0.0.2",), "gpu-7": "not known"}}
    found = check_hostnames(cluster(n1=main, n3={"hostname": "gpu-7"}))
    assert [f.node for f in found] == ["n3"]
    assert "hostname 'gpu-7' does not resolve on the main node n1" in found[0].problem


def test_main_port_in_use_on_node_zero() -> None:
    busy = {"port": 29500, "port_free": False, "port_error": "Address already in use"}
    found = check_main_port(cluster(n1=busy), "n1", 29500)
    assert [(f.node, f.check) for f in found] == [("n1", "network")]
    assert "main port 29500 is already in use on n1 (Address already in use)" in found[0].problem
    assert "--main-port" in found[0].fix
    assert found[0].severity == "error"


def test_a_port_orch_picked_and_another_process_took_meanwhile_is_only_a_warning() -> None:
    # doctor with no --main-port picks a port free on node 0, then probes it: on a shared
    # machine another process may take it in between; a launch picks its own.
    busy = {"port": 29686, "port_free": False, "port_error": "Address already in use"}
    [found] = check_main_port(cluster(n1=busy), "n1", 29686, chosen=True)
    assert (found.node, found.check, found.severity) == ("n1", "network", "warning")
    assert "port 29686, free on n1 when orch picked it for this check, was taken" in found.problem
    assert "--main-port" in found.fix


def test_main_port_unreachable_from_one_node() -> None:
    listening = {"port": 29500, "port_free": True}
    found = check_main_port(
        cluster(
            n1=listening,
            n2={"main_reached": True},
            n3={"main_reached": False, "main_error": "Connection timed out"},
        ),
        "n1",
        29500,
    )
    assert [f.node for f in found] == ["n3"]
    assert "cannot connect to the main node at n1:29500 (Connection timed out)" in found[0].problem
    assert "nc -zv n1 29500" in found[0].fix


def test_no_port_findings_when_node_zero_gave_no_facts() -> None:
    items = [NodeProbe("n1", None, NodeError("refused", "n1: refused", "start sshd")),
             *cluster(n2={"main_reached": False, "main_error": "refused"})[1:]]  # fmt: skip
    assert check_main_port(items, "n1", 29500) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("eth", ["eth0", "eth1"]),
        ("=eth0", ["eth0"]),
        ("^docker,lo", ["eth0", "eth1", "ib0"]),
        ("^=eth0", ["docker0", "eth1", "ib0", "lo"]),
        ("ib,eth1", ["eth1", "ib0"]),
    ],
)
def test_nccl_socket_ifname_rules(value: str, expected: list[str]) -> None:
    names = ["docker0", "eth0", "eth1", "ib0", "lo"]
    assert interfaces_matching(value, names) == expected


def test_nccl_socket_ifname_missing_on_a_node() -> None:
    items = cluster(n2={"interfaces": {"lo": ("127.0.0.1",), "ens5": ("10.0.0.2",)}})
    found = check_nccl_env(items, {"NCCL_SOCKET_IFNAME": "eth0"})
    assert [f.node for f in found] == ["n2"]
    assert "NCCL_SOCKET_IFNAME=eth0 matches no interface" in found[0].problem
    assert "ens5" in found[0].problem
    assert shared_interfaces(items) == ()


def test_ib_settings_without_ib_devices() -> None:
    warn = check_nccl_env(cluster(), {"NCCL_IB_DISABLE": "0"})
    assert {f.severity for f in warn} == {"warning"} and len(warn) == 3
    err = check_nccl_env(cluster(n1={"ib_devices": ("mlx5_0",)}), {"NCCL_NET": "IB"})
    assert [(f.node, f.severity) for f in err] == [("n2", "error"), ("n3", "error")]
    assert check_nccl_env(cluster(), {"NCCL_IB_DISABLE": "1"}) == []


def test_gpu_checks() -> None:
    gpu = GpuInfo("0", "NVIDIA A100", "535.1", "0", "GPU-1")
    found = check_gpus(
        cluster(
            n1={"gpus": (gpu,), "nvidia_smi": "ok"},
            n2={"gpus": (gpu, gpu), "nvidia_smi": "ok", "gpu_busy_pids": ("4242",)},
            n3={"nvidia_smi": "error: NVIDIA-SMI has failed"},
        ),
        {"n1": 8, "n2": 2, "n3": 8},
    )
    problems = {(f.node, f.severity): f.problem for f in found}
    assert "gives n1 8 slots but it has 1 GPUs" in problems[("n1", "error")]
    assert "4242" in problems[("n2", "warning")]
    assert "nvidia-smi fails on n3" in problems[("n3", "error")]


def test_disk_thresholds() -> None:
    found = check_disk(cluster(n1={"disk_free_bytes": 200 << 20}, n2={"disk_free_bytes": 3 << 30}))
    assert [(f.node, f.severity) for f in found] == [("n1", "error"), ("n2", "warning")]


def test_accelerate_config_without_deepspeed_hostfile() -> None:
    config = {
        "distributed_type": "DEEPSPEED",
        "num_machines": 2,
        "deepspeed_config": {"deepspeed_multinode_launcher": "pdsh", "zero_stage": 2},
    }
    found = check_accelerate_config(config, "acc.yaml")
    assert len(found) == 1 and "acc.yaml: deepspeed_hostfile is unset" in found[0].problem
    config["deepspeed_config"]["deepspeed_hostfile"] = "/etc/hostfile"
    assert check_accelerate_config(config, "acc.yaml") == []
    single = {"distributed_type": "DEEPSPEED", "num_machines": 1}
    assert check_accelerate_config(single, "acc.yaml") == []


def test_nccl_transport_from_debug_output() -> None:
    socket_log = (
        "n1:1:1 [0] NCCL INFO Using network Socket\n"
        "n1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
        "n1:1:1 [0] NCCL INFO Channel 00 : 1[1] -> 0[0] via P2P/IPC\n"
    )
    assert nccl_transport(socket_log) == "NET/Socket"
    assert nccl_transport("NCCL INFO Channel 00 : 0[0] -> 1[0] [send] via NET/IB/0") == "NET/IB"
    assert nccl_transport("no nccl here") is None


def test_collective_fallback_to_sockets_on_an_ib_node_and_slow_links() -> None:
    items = cluster(n1={"ib_devices": ("mlx5_0",)})
    results = [
        CollectiveResult("n1", True, "nccl", 0.1, 9000.0, "NET/Socket"),
        CollectiveResult("n2", True, "nccl", 0.1, 10000.0, "NET/IB"),
        CollectiveResult("n3", True, "nccl", 0.9, 1000.0, "NET/IB"),
    ]
    found = check_collective(results, items)
    assert [(f.node, f.severity) for f in found] == [("n1", "error"), ("n3", "warning")]
    assert "NCCL_NET=IB" in found[0].fix
    failed = check_collective([CollectiveResult("n2", False, error="timed out")], items)
    assert "all_reduce failed on n2: timed out" in failed[0].problem


def test_report_marks_unreachable_nodes_and_serialises() -> None:
    hostfile = parse_hostfile("n1 slots=1\nn2 slots=1\n")
    items = [
        NodeProbe("n1", facts("n1", nccl_env={"NCCL_DEBUG": "INFO", "NCCL_IB_KEY": "s3cret"})),
        NodeProbe("n2", None, NodeError("auth", "n2: authentication rejected", "ssh-copy-id")),
    ]
    report = build_report(PreflightRequest(hostfile, python=PY, workdir="/work", env={}), items)
    assert not report.ok
    assert report.nodes[1].groups["ssh"] == "error"
    assert report.nodes[1].groups["parity"] == "-"
    assert report.nodes[0].groups["ssh"] == "ok"
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["ok"] is False
    assert doc["findings"][0]["node"] == "n2" and doc["findings"][0]["check"] == "ssh"
    assert doc["nodes"][0]["facts"]["packages"]["accelerate"] == "1.15.0"
    assert doc["nodes"][1]["facts"] is None
    assert doc["nodes"][0]["facts"]["nccl_env"] == {"NCCL_DEBUG": "INFO", "NCCL_IB_KEY": "***"}
    assert "s3cret" not in json.dumps(doc)


@pytest.mark.process
def test_checks_and_probe_parsing_import_no_ssh_or_process_code() -> None:
    check = (
        "import sys, orchestrator.checks.report, orchestrator.probe.facts; "
        "print(sorted(m for m in ('paramiko', 'subprocess', 'socket') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def _stacks(**changes: object) -> list[str]:
    found = check_stacks(probes(facts("n1", stacks_probed=True, **changes)), "/venv/bin/python")
    assert all(f.severity == "warning" and f.check == "stacks" for f in found)
    return [f"{f.problem} | {f.fix}" for f in found]


def test_stacks_can_be_taken_as_root_with_ptrace_or_as_a_user_where_yama_allows():
    assert _stacks(py_spy="/venv/bin/py-spy", root=True, cap_sys_ptrace=True) == []
    assert _stacks(py_spy="/usr/bin/py-spy", root=False, ptrace_scope=0) == []
    assert _stacks(py_spy="/usr/bin/py-spy", root=False, ptrace_scope=None) == []  # no Yama


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"py_spy": None}, "py-spy not found beside /venv/bin/python or on PATH on n1 | "
                           "/venv/bin/python -m pip install py-spy"),
        ({"py_spy": "/p", "root": True, "cap_sys_ptrace": False},
         "root on n1 lacks CAP_SYS_PTRACE (a container drops it) | start the container with "
         "--cap-add SYS_PTRACE"),
        ({"py_spy": "/p", "root": False, "ptrace_scope": 1},
         "kernel.yama.ptrace_scope=1 on n1: py-spy may not attach to ranks it did not start | "
         "sysctl -w kernel.yama.ptrace_scope=0"),
        ({"py_spy": "/p", "root": True, "cap_sys_ptrace": True, "ptrace_scope": 3},
         "ptrace is disabled on n1 (kernel.yama.ptrace_scope=3)"),
    ],
)
def test_a_node_where_stacks_cannot_be_taken_says_why_and_the_fix(changes, said):
    [found] = _stacks(**changes)
    message, _, fix = said.partition(" | ")
    problem, _, found_fix = found.partition(" | ")
    assert problem.startswith("py-spy cannot take stacks: " + message)
    assert problem.endswith("orch stacks falls back to each rank's faulthandler (no ptrace "
                            "needed; Python frames only, profiles at 20 samples/s)")  # fmt: skip
    assert found_fix.startswith(fix)


def test_a_probe_that_says_nothing_of_stacks_gives_no_stacks_finding():
    assert check_stacks(probes(facts("n1", py_spy=None)), "/venv/bin/python") == []


def test_a_node_whose_own_directory_cannot_be_used_fails_naming_path_owner_mode_and_fix():
    said = "/tmp/orch-1000 (owner mallory (uid 1001), mode 0755) belongs to another user"
    fix = "remove it (rm -rf -- /tmp/orch-1000, as its owner or root) and run again"
    bad = OwnDirectory("runs", "/tmp/orch-1000/runs", said, fix)
    good = OwnDirectory("ports", "/tmp/orch-1000/ports")
    probes = [
        NodeProbe("n1", facts("n1", own_dirs=(good,))),
        NodeProbe("n2", facts("n2", own_dirs=(bad, good))),
        NodeProbe("n3", facts("n3")),  # an older probe: says nothing
    ]
    [finding] = check_own_directories(probes)
    assert finding.node == "n2" and finding.check == "files" and finding.severity == "error"
    assert "/tmp/orch-1000/runs" in finding.problem and "mallory (uid 1001)" in finding.problem
    assert "mode 0755" in finding.problem and "node directory" in finding.problem
    assert finding.fix == f"on n2: {fix}"
    hostfile = parse_hostfile("n1 slots=1\nn2 slots=1\nn3 slots=1\n")
    report = build_report(PreflightRequest(hostfile, python=PY, env={}), probes)
    assert finding in report.findings


def test_a_slow_or_noisy_shell_start_up_is_named_with_what_it_printed() -> None:
    from orchestrator.checks.node import check_shell
    from orchestrator.pernode import ShellStartup

    items = [
        NodeProbe("n1", facts("n1"), shell=ShellStartup(0.05, "")),
        NodeProbe("n2", facts("n2"), shell=ShellStartup(3.2, "pyenv: cannot rehash")),
        NodeProbe("n3", facts("n3"), shell=ShellStartup(0.1, "stty: not a tty")),
        NodeProbe("n4", None, NodeError("auth", "n4: rejected", "ssh-copy-id")),
    ]
    found = check_shell(items)
    assert [(f.node, f.check, f.severity) for f in found] == [
        ("n2", "shell", "warning"), ("n3", "shell", "warning")
    ]  # fmt: skip
    assert found[0].problem == (
        "the shell on n2 takes 3.2s to start (timed over SSH until it runs orch's command): "
        "every command orch runs there waits that long; its start-up prints on stderr on n2: "
        "pyenv: cannot rehash"
    )
    assert found[1].problem == "its start-up prints on stderr on n3: stty: not a tty"
    assert "~/.bashrc" in found[1].fix
