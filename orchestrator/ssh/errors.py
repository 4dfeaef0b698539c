"""SSH failures: a kind, a message naming the node, and a hint with the fix."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import OrchError

FAILURE_KINDS = (
    "resolve",
    "refused",
    "timeout",
    "auth",
    "hostkey-unknown",
    "hostkey-changed",
    "hostkey-revoked",
    "command",
    "other",
)


# ----- results and errors --------------------------------------------------------
@dataclass(frozen=True)
class SSHFailure:
    node: str
    kind: str
    message: str
    hint: str
    stderr: str = ""  # the last lines the node printed on stderr, when a command failed


class SSHError(OrchError):
    def __init__(self, failure: SSHFailure) -> None:
        super().__init__(failure.message, failure.hint)
        self.failure = failure


def ssh_error(node: str, kind: str, message: str, hint: str, stderr: str = "") -> SSHError:
    return SSHError(SSHFailure(node=node, kind=kind, message=message, hint=hint, stderr=stderr))
