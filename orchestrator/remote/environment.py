"""The job's Python environment on a node: STANDARD LIBRARY ONLY, loaded beside the probe (as
orch_environment) and run on its own on the head (`python -c`, printing one JSON document).

What it reports: every installed distribution the interpreter sees but orch's own (its
name normalized as pip compares names, and its version, from `importlib.metadata`; the
first one on sys.path wins, as import does), the interpreter (implementation, version,
ABI), the platform (OS release, libc, machine), and one fingerprint over all of it.
Reading the metadata files takes milliseconds; nothing is imported. About 25 bytes per
distribution come back.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import sys
from typing import Any

# orch runs on the head only (its node programs are shipped inline): the nodes need not have it.
NOT_THE_JOBS = frozenset({"orch"})


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions() -> dict[str, str]:
    from importlib import metadata

    # `python -c` puts the current directory first on sys.path: a project's *.egg-info
    # there is the directory's, not the environment's, and differs between head and nodes.
    path = sys.path[1:] if sys.path and sys.path[0] == "" else sys.path
    found = {}
    for dist in metadata.distributions(path=path):
        try:
            meta = dist.metadata
            name, version = meta["Name"], meta["Version"]
        except (OSError, KeyError, TypeError, ValueError):
            continue  # a broken dist-info: import cannot use it either
        if name and _normalized(name) not in NOT_THE_JOBS:
            found.setdefault(_normalized(name), version or "")
    return dict(sorted(found.items()))


def os_release() -> str:
    """`ID VERSION_ID` of /etc/os-release (`debian 12`): what binary wheels depend on."""
    fields = {}
    try:
        with open("/etc/os-release") as handle:
            for line in handle:
                key, _, value = line.strip().partition("=")
                fields[key] = value.strip('"')
    except OSError:
        return platform.system()
    return " ".join(v for v in (fields.get("ID"), fields.get("VERSION_ID")) if v)


def interpreter() -> dict[str, str]:
    import sysconfig

    return {
        "implementation": sys.implementation.name,
        "version": platform.python_version(),
        "abi": sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag or "",
    }


def platform_facts() -> dict[str, str]:
    libc, libc_version = platform.libc_ver()
    return {
        "system": platform.system(),
        "os": os_release(),
        "libc": f"{libc} {libc_version}".strip(),
        "machine": platform.machine(),
    }


def fingerprint(env: dict[str, Any]) -> str:
    canonical = json.dumps(env, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def environment() -> dict[str, Any]:
    env = {"interpreter": interpreter(), "platform": platform_facts(), "dists": distributions()}
    env["fingerprint"] = fingerprint(env)
    return env


def main(argv: list[str]) -> int:
    print(json.dumps(environment(), sort_keys=True, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
