"""Everything that runs on a node (or, for accelerate_head, in the job's own interpreter on
the head): the agent, the wire format, the probe, the collective check. Standard library only
at module level, since these files are shipped inline to nodes that have no orch installed;
a function may import the job's own stack (torch, accelerate, yaml), which the node has.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def program_source(name: str) -> str:
    """The text of remote/<name>.py, as it is shipped to a node (read, never imported)."""
    return (_HERE / f"{name}.py").read_text(encoding="utf-8")
