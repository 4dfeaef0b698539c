"""The node agent's spec: what the head tells every node's agent on its command line, as one
frozen value, and its one-word wire form; where a job's files live on a node: in the user's
own directory there (/tmp/orch-<uid>/runs/<job>/<node>, the uid the node's own, which only
the node knows: ssh_config's User may name another account than the head's; or below the
user's ORCH_NODE_ROOT, which the spec carries), each level made and checked
(remote/owned.py).

STANDARD LIBRARY ONLY: shipped inline beside the agent (plan/agent_command.py). The head's
plan builds the spec (plan/launch_plan.py; the pdsh launcher's shim adds DeepSpeed's per-node
command, plan/pdsh_command.py), the agent reads it (remote/agent.py). It holds no value of the
job's environment and no word the user typed: those reach the node in PRIVATE_FILE, which the
spec names by its hash.
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any

try:  # on a node, loaded beside this program
    import orch_owned as owned
except ImportError:
    from orchestrator.remote import owned

RANK_PROGRAM = "orch-rank"  # what the launchers start in place of the script (--no_python)

RUNS_DIR = "runs"  # in the user's own directory: one directory per job, one per node in it
UID_SHOWN = "<uid>"  # the uid in a node directory as messages name it
PRIVATE_FILE = "private.json"  # the job's env and the rank's argv, written by the head
GRACE_S = 5.0  # seconds between TERM and KILL when the job's processes are stopped

Pairs = tuple[tuple[str, str], ...]
_PAIRS = ("files", "env", "path_first")  # sent as JSON objects


def runs_root(uid: int, root: str = "") -> str:
    """Where the user's jobs keep their files on this node (`root`: the user's setting)."""
    return os.path.join(owned.user_directory(uid, root), RUNS_DIR)


def node_dir(job_id: str, node: str, uid: int, root: str = "") -> str:
    """The job's directory on this node: raw logs, files the spec ships, the ranks' socket."""
    return os.path.join(runs_root(uid, root), job_id, node)


def node_dir_shown(job_id: str, node: str, root: str = "") -> str:
    """The job's directory on a node as the head names it: the uid is the node's (and
    where another user made /tmp/orch-<uid> first, $XDG_RUNTIME_DIR/orch stands in)."""
    top = root or owned.default_directory(UID_SHOWN)
    return os.path.join(top, RUNS_DIR, job_id, node)


def make_node_dir(job_id: str, node: str, uid: int, root: str = "") -> str:
    """The job's directory on this node, made (each level under umask 077) and checked (each
    a directory of the user's own that nobody else can write, no link): raises
    owned.UnsafeDirectory naming the path, its owner, its mode and the fix."""
    return owned.user_directories(uid, [RUNS_DIR, job_id, node], root)


@dataclass(frozen=True)
class AgentSpec:
    job_id: str
    workdir: str = ""  # "": the directory the agent was started in
    grace: float = GRACE_S
    files: Pairs = ()  # (name, content), written into the node directory
    private_sha256: str = ""  # "": no private file for this job
    wait_for: tuple[str, int] | None = None  # workers start once node 0's main port answers
    main_port: int = 0  # node 0 confirms what listens there is the job's (0: nothing to check)
    # What the node runs: `shell` if set, else its node rank's entry of `commands` (when the
    # nodes' commands differ), else `command` with `node_rank_word` replaced by its rank.
    command: tuple[str, ...] = ()
    commands: tuple[tuple[str, ...], ...] = ()
    shell: str = ""
    node_rank_word: str = ""  # pdsh's %n, in DeepSpeed's words
    env: Pairs = ()  # the launcher's own settings (pdsh launcher); the job's env wins
    path_first: Pairs = ()  # (variable, directory): put first on that path variable
    # Under srun: each line labelled with the node, whose rank is its place in `hosts`; a
    # failed node's agent lingers this long for the head to end the step.
    hosts: tuple[str, ...] = ()
    label_lines: bool = False
    linger_s: float = 0.0
    node_root: str = ""  # the user's ORCH_NODE_ROOT ("": orch's default place on the node)

    def node_argv(self, node_rank: str) -> list[str]:
        """What the agent on the node with this rank runs."""
        if self.shell:
            return ["/bin/sh", "-c", self.shell]
        if self.commands:
            return list(self.commands[int(node_rank)])
        if self.node_rank_word:
            return [word.replace(self.node_rank_word, node_rank) for word in self.command]
        return list(self.command)

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON types, pairs as objects, tuples as lists; a field left at its
        default is left out (the spec travels on the agent's command line)."""
        doc: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.default is not MISSING and value == field.default:
                continue
            if field.name in _PAIRS:
                value = dict(value)
            elif isinstance(value, tuple):
                value = [list(item) if isinstance(item, tuple) else item for item in value]
            doc[field.name] = value
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> AgentSpec:
        """The spec from its JSON form (to_dict's); an unknown field is a TypeError."""
        wait_for = doc.get("wait_for")
        return cls(**{
            **doc,
            **{name: _pairs(doc.get(name, {})) for name in _PAIRS},
            "wait_for": (str(wait_for[0]), int(wait_for[1])) if wait_for else None,
            "command": _words(doc.get("command", ())),
            "commands": tuple(_words(command) for command in doc.get("commands", ())),
            "hosts": _words(doc.get("hosts", ())),
        })  # fmt: skip


def _pairs(mapping: Mapping[str, object]) -> Pairs:
    return tuple((str(key), str(value)) for key, value in mapping.items())


def _words(words: Sequence[object]) -> tuple[str, ...]:
    return tuple(str(word) for word in words)


def encode(spec: AgentSpec) -> str:
    """The spec as one shell-safe word. Compressed: it travels in the remote command line,
    which Linux caps at 128 KiB per argument, and the standard launcher's configs (one per
    machine, differing in one line) shrink a hundredfold."""
    text = json.dumps(spec.to_dict())
    return base64.b64encode(zlib.compress(text.encode(), 9)).decode()


def decode(word: str) -> AgentSpec:
    """The spec from its one-word form (encode's)."""
    return AgentSpec.from_dict(json.loads(zlib.decompress(base64.b64decode(word))))
