"""Everything that runs on a node (or, for accelerate_head, in the job's own interpreter on
the head): the agent, the wire format, the probe, the collective check. Standard library only
at module level, since these files are shipped inline to nodes that have no orch installed;
a function may import the job's own stack (torch, accelerate, yaml), which the node has.
"""

import base64
import zlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent

_BOOT = """\
import sys, types
def _load(name, source):
    module = types.ModuleType(name)
    module.__orch_source__ = source
    sys.modules[name] = module
    exec(compile(source, name, "exec"), module.__dict__)
    return module
%s
sys.exit(_load(%r, %r).main(sys.argv[1:]))
"""


def program_source(name: str) -> str:
    """The text of remote/<name>.py, as it is shipped to a node (read, never imported)."""
    return (_HERE / f"{name}.py").read_text(encoding="utf-8")


def boot_blob(helpers: tuple[str, ...], program: str) -> str:
    """remote/<program>.py run with each remote/<helper>.py loaded beside it (as orch_<name>,
    which is what they import each other by), in order: a helper after those it imports;
    compressed, base64."""
    first = "\n".join(f"_load({f'orch_{name}'!r}, {program_source(name)!r})" for name in helpers)
    payload = _BOOT % (first, f"orch_{program}", program_source(program))
    return base64.b64encode(zlib.compress(payload.encode(), 9)).decode()


def boot_code(blob: str) -> str:
    """The one line of Python (for `python -c`) that runs a boot_blob."""
    return f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{blob}')))"
