"""One node's doctor facts as a healthy node of the test cluster reports them (n1..n3)."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.probe.facts import NodeFacts

PY = "/opt/venv/bin/python"
NAMES = ["n1", "n2", "n3"]
ADDRS = {"n1": ("10.0.0.1",), "n2": ("10.0.0.2",), "n3": ("10.0.0.3",)}


def facts(node: str, **changes: object) -> NodeFacts:
    base = NodeFacts(
        node=node,
        hostname=node,
        os="Debian GNU/Linux 12 (bookworm)",
        kernel="6.1",
        python_requested=PY,
        python_found=True,
        python_executable=PY,
        python_version="3.11.7",
        packages={
            "torch": "2.13.0+cpu",
            "deepspeed": "0.19.8",
            "accelerate": "1.15.0",
            "transformers": "5.23.0",
            "colossalai": None,
            "nccl": None,
        },
        torch_cuda=None,
        nvidia_smi="absent",
        gpus=(),
        gpu_busy_pids=(),
        disk_path="/work",
        disk_free_bytes=80 << 30,
        workdir="/work",
        workdir_exists=True,
        script="/work/train.py",
        script_exists=True,
        script_sha256="a" * 64,
        interfaces={"lo": ("127.0.0.1",), "eth0": ("10.0.0.9",), "docker0": ("172.17.0.1",)},
        ib_devices=(),
        resolved=dict(ADDRS),
        resolve_errors={},
    )
    return replace(base, **changes)
