"""Environment parity over facts: every distribution, the interpreter and the platform of
every node against the head's (or node 0's), grouped by package. Pure, tested on values."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from _doctor_facts import facts

from orchestrator.checks.environment import (
    PushFix,
    env_push_command,
    environment_findings,
    environment_parity,
    script_distributions,
    script_imports,
)
from orchestrator.checks.model import HEAD
from orchestrator.probe.facts import Environment, NodeFacts, parse_environment

PY = "/opt/venv/bin/python"
BASE = {"torch": "2.13.0+cpu", "accelerate": "1.15.0", "transformers": "4.46.1",
        "numpy": "2.1.0", "tqdm": "4.67.1", "requests": "2.32.3"}  # fmt: skip


def env(dists: dict[str, str] | None = None, **changes: str) -> Environment:
    dists = dict(BASE if dists is None else dists)
    base = Environment("", "cpython", "3.11.7", "cpython-311-x86_64-linux-gnu", "debian 12",
                       "glibc 2.36", "x86_64", dists)  # fmt: skip
    made = replace(base, **changes)
    canonical = json.dumps([made.python_version, made.abi, made.platform, sorted(dists.items())])
    print_ = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    return replace(made, fingerprint=print_)


def node(name: str, environment: Environment | None = None, **changes: object) -> NodeFacts:
    return facts(name, environment=environment or env(), **changes)


def without(name: str) -> dict[str, str]:
    return {k: v for k, v in BASE.items() if k != name}


def test_identical_environments_differ_in_nothing() -> None:
    parity = environment_parity([node("n1"), node("n2")], env())
    assert parity is not None and parity.reference == HEAD
    assert parity.differences == ()
    assert len({p for _, p in parity.fingerprints}) == 1
    assert environment_findings(parity, PY) == []


def test_differences_are_grouped_by_package_and_name_every_node() -> None:
    older = {**BASE, "transformers": "4.46.0"}
    nodes = [node("node1"), node("node2", env(older)), node("node3", env(without("transformers"))),
             node("node4", env(older))]  # fmt: skip
    parity = environment_parity(nodes, env())
    assert parity is not None
    [diff] = parity.differences
    assert diff.item == "transformers" and diff.kind == "launcher" and diff.severity == "error"
    assert diff.describe(parity.reference) == (
        "4.46.0 on node2, node4; missing on node3; 4.46.1 elsewhere"
    )
    found = environment_findings(parity, PY)
    assert [(f.node, f.check, f.severity) for f in found] == [
        ("node2", "parity", "error"), ("node3", "parity", "error"), ("node4", "parity", "error")
    ]  # fmt: skip
    assert "transformers 4.46.0 (4.46.1 on the head)" in found[0].problem
    assert found[0].fix == f"on node2: `{PY} -m pip install transformers==4.46.1`"
    assert "transformers missing (4.46.1 on the head)" in found[1].problem


def test_a_package_only_one_node_has_is_removed_there() -> None:
    extra = {**BASE, "left-over": "0.1"}
    parity = environment_parity([node("n1"), node("n2", env(extra))], env())
    assert parity is not None
    [diff] = parity.differences
    assert diff.describe(parity.reference) == "0.1 on n2; missing elsewhere"
    [finding] = environment_findings(parity, PY)
    assert finding.severity == "warning"  # neither a launcher's nor the script's
    assert finding.fix == f"on n2: `{PY} -m pip uninstall -y left-over`"


def test_the_fix_names_the_push_of_the_jobs_own_hostfile_and_python() -> None:
    parity = environment_parity([node("n1"), node("n2", env(without("transformers")))], env())
    command = env_push_command(PY, hostfile="hosts/my cluster.txt")
    assert command == f"orch env push --hostfile 'hosts/my cluster.txt' --python {PY}"
    [finding] = environment_findings(parity, PY, PushFix(command, option=True))
    assert finding.fix == (
        f"on n2: `{PY} -m pip install transformers==4.46.1`; or copy the head's environment: "
        f"`orch env push --hostfile 'hosts/my cluster.txt' --python {PY}`, or launch again "
        "with --push-env"
    )
    [pushing] = environment_findings(parity, PY, PushFix(command, option=False))
    assert pushing.fix.endswith(f"--python {PY}`")  # the job pushes already: no --push-env
    [no_file] = environment_findings(parity, PY, PushFix(None, option=True))
    assert no_file.fix.endswith("; or launch again with --push-env")
    odd = env(python_version="3.11.9")
    [interpreter] = environment_findings(environment_parity([node("n2", odd)], env()), PY,
                                         PushFix(command))  # fmt: skip
    assert "make /opt/venv/bin/python the same interpreter" in interpreter.fix
    assert interpreter.fix.endswith(f"copy the head's environment: `{command}`")


def test_the_push_command_follows_where_the_nodes_come_from() -> None:
    assert env_push_command(PY, slurm=True) == f"orch env push --slurm --python {PY}"
    assert env_push_command(PY, hostfile="hf", include="n[1-2]", exclude="n2") == (
        f"orch env push --hostfile hf --python {PY} --include 'n[1-2]' --exclude n2"
    )
    # with node 0 as the reference (the head has no such interpreter) nothing is pushed
    parity = environment_parity([node("n1"), node("n2", env(without("tqdm")))], None)
    [finding] = environment_findings(parity, PY, PushFix("orch env push", option=True))
    assert "push" not in finding.fix


def test_when_every_node_differs_from_the_head_the_head_is_named() -> None:
    newer = {**BASE, "numpy": "2.2.0"}
    parity = environment_parity([node("n1", env(newer)), node("n2", env(newer))], env())
    assert parity is not None
    assert parity.differences[0].describe(parity.reference) == "2.2.0 on n1, n2; 2.1.0 on the head"


def test_most_important_first_interpreter_launcher_script_rest() -> None:
    changed = {**BASE, "torch": "2.12.0", "requests": "2.31.0", "tqdm": "4.66.0",
               "numpy": "1.26.4"}  # fmt: skip
    odd = env(changed, python_version="3.11.9")
    imports = script_imports("import numpy as np\nfrom tqdm.auto import tqdm\n")
    script = script_distributions(imports, {})
    parity = environment_parity([node("n1"), node("n2", odd)], env(), script)
    assert parity is not None
    assert [(d.item, d.kind) for d in parity.differences] == [
        ("python", "interpreter"), ("torch", "launcher"), ("numpy", "script"), ("tqdm", "script"),
        ("requests", "other"),
    ]  # fmt: skip
    [finding] = environment_findings(parity, PY)
    assert "in 5 item(s): python cpython 3.11.9 (cpython 3.11.7 on the head)" in finding.problem
    assert finding.problem.endswith("and 1 more")
    assert "make /opt/venv/bin/python the same interpreter" in finding.fix


def test_without_the_interpreter_on_the_head_node_zero_is_the_reference() -> None:
    parity = environment_parity([node("n1"), node("n2", env(without("tqdm")))], None)
    assert parity is not None and parity.reference == "n1"
    assert [who for who, _ in parity.fingerprints] == ["n1", "n2"]
    assert parity.differences[0].describe(parity.reference) == "missing on n2; 4.67.1 on n1"


def test_nodes_without_the_jobs_interpreter_are_left_to_the_interpreter_check() -> None:
    gone = node("n2", env(without("torch")), python_found=False)
    assert environment_parity([node("n1"), gone], None) is None
    parity = environment_parity([node("n1"), gone], env())
    assert parity is not None and parity.differences == ()


def test_the_platform_is_compared_as_one_item() -> None:
    arm = env(machine="aarch64")
    parity = environment_parity([node("n1"), node("n2", arm)], env())
    assert parity is not None
    [diff] = parity.differences
    assert diff.item == "platform" and diff.severity == "error"
    assert diff.describe(HEAD) == (
        "debian 12, glibc 2.36, aarch64 on n2; debian 12, glibc 2.36, x86_64 elsewhere"
    )


def test_script_imports_are_read_without_running_the_script() -> None:
    source = (
        "import os, numpy.linalg\nfrom accelerate import Accelerator\nfrom . import local\n"
        "def f():\n    import yaml\n"
    )
    assert script_imports(source) == {"os", "numpy", "accelerate", "yaml"}
    assert script_imports("def (:\n") == frozenset()
    providers = {"yaml": ["PyYAML"], "PIL": ["Pillow"]}
    assert script_distributions({"yaml", "numpy"}, providers) == {"pyyaml", "numpy"}


def test_the_probes_environment_document_is_parsed() -> None:
    doc = {"fingerprint": "ab" * 8, "dists": {"torch": "2.13.0"},
           "interpreter": {"implementation": "cpython", "version": "3.11.7", "abi": "cp311"},
           "platform": {"os": "debian 12", "libc": "glibc 2.36", "machine": "x86_64"}}  # fmt: skip
    parsed = parse_environment(doc)
    assert parsed is not None and parsed.dists == {"torch": "2.13.0"}
    assert parsed.platform == "debian 12, glibc 2.36, x86_64"
    assert parse_environment(None) is None and parse_environment({"dists": []}) is None
