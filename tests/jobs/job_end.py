"""How the test jobs end: with their exit code, straight from the process, once every line
they wrote is out. What orch sees of a rank is the same: each line and the code.

Not through the interpreter's own exit, for two reasons. After `import torch` it costs a
third of a CPU-second (`python -c "import torch"` against the same with os._exit), and the
suite starts hundreds of ranks on two cores. And with gloo it can abort a rank after
destroy_process_group (about 1 run in 6 in the sandbox, "terminate called without an active
exception"): gloo's worker thread, handing a dropped collective's tensors back to Python,
cannot take the GIL while the main thread finalizes the interpreter, and is unwound through
a noexcept destructor.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def end(code: int | None) -> NoReturn:
    """Exit with `code` (None: 0), as sys.exit(main()) would, without the interpreter's
    teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
