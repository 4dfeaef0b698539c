"""Raw node logs pulled back go through the head's redaction (run/collect.py), over a
session that serves a local directory as the node's."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from orchestrator.run.collect import _collect_over
from orchestrator.ssh.session import CommandResult


class _LocalNode:
    """The two things collecting asks of a node's session: the listing of sizes and hashes
    (any other command, the removal, succeeds), and a file's download."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def run(self, command: str, timeout: float, stdin: bytes | None = None) -> CommandResult:
        if "sha256sum" not in command:
            return CommandResult("n1", 0, b"", b"")
        lines = [f"dir {self.directory}"] + [
            f"{path.stat().st_size} {hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}"
            for path in sorted(self.directory.iterdir())
        ]
        return CommandResult("n1", 0, "\n".join(lines).encode() + b"\n", b"")

    def download(self, remote: str, local: Path, timeout: float) -> None:
        shutil.copyfile(self.directory / Path(remote).name, local)


def test_pulled_logs_are_verified_as_the_node_has_them_then_masked(tmp_path: Path) -> None:
    node = tmp_path / "node"
    node.mkdir()
    raw = b"loading with token hf_secret123\r50%\rdone\n"
    (node / "rank0.stdout.raw").write_bytes(raw)
    (node / "stderr.raw").write_bytes(b"")
    local = tmp_path / "nodes" / "n1"
    result = _collect_over(_LocalNode(node), "n1", "j", local,  # type: ignore[arg-type]
                           keep_remote=True, timeout=5, secrets=("hf_secret123",))  # fmt: skip
    assert result.ok, result.why
    assert (local / "rank0.stdout.raw").read_bytes() == b"loading with token ***\r50%\rdone\n"
    [pulled] = [f for f in result.value.files if f.name == "rank0.stdout.raw"]
    assert pulled.sha256 == hashlib.sha256(raw).hexdigest()  # what the node had, verified
    assert (node / "rank0.stdout.raw").read_bytes() == raw  # the node's own copy is its own
