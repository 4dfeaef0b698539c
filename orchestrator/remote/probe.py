"""The node-side probe: STANDARD LIBRARY ONLY, shipped to each node as `python -c`, with
owned.py, agent_spec.py, ports.py, environment.py and digest.py loaded beside it (as
orch_<name>): it
makes and checks the user's own directory as a launch would, and reports the job's whole
Python environment.

It prints one JSON document of facts about the node and the job's environment.
It reads package versions from installed metadata (importing torch would take
seconds per node), and bounds everything that could block (DNS, nvidia-smi).

Argument: one JSON object {"python", "workdir", "script", "names", "main"}.
"main" makes node 0 hold the main port open (the "is it free" test) while every
other node connects to it (the `nc -zv main port` test), all in the same run.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

try:  # on a node, loaded beside this program
    import orch_agent_spec as agent_spec
    import orch_digest as digest
    import orch_environment as environment
    import orch_filesystem as filesystem
    import orch_owned as owned
    import orch_ports as ports
except ImportError:
    from orchestrator.remote import agent_spec, digest, environment, filesystem, owned, ports

PROBE_VERSION = 1
PACKAGES = ("torch", "deepspeed", "accelerate", "transformers", "colossalai", "tqdm", "numpy")
NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
_SIOCGIFADDR = 0x8915


def package_versions() -> dict[str, str | None]:
    from importlib import metadata

    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["nccl"] = None
    for dist in NCCL_DISTS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found["nccl"] = metadata.version(dist)
            break
    return found


def torch_cuda_version() -> str | None:
    """torch's build CUDA version from torch/version.py, without importing torch."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        try:
            with open(os.path.join(location, "version.py")) as handle:
                text = handle.read()
        except OSError:
            continue
        match = re.search(r"^cuda\b[^=\n]*=\s*['\"]?([^'\"\n]+)", text, re.MULTILINE)
        if match:
            value = match.group(1).strip()
            return None if value == "None" else value
    return None


def _run(argv: list[str], timeout: float) -> tuple[str | None, str | None]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, str(err)
    if done.returncode != 0:
        return None, (done.stderr or done.stdout).strip()[:300]
    return done.stdout, None


def gpus() -> dict[str, Any]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {"status": "absent", "gpus": [], "busy": []}
    out, err = _run(
        [smi, "--query-gpu=index,name,driver_version,memory.used,uuid",
         "--format=csv,noheader,nounits"],
        8,
    )  # fmt: skip
    if out is None:
        return {"status": "error: " + err, "gpus": [], "busy": []}
    found = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            found.append(
                {"index": parts[0], "name": parts[1], "driver": parts[2],
                 "memory_used_mib": parts[3], "uuid": parts[4]}
            )  # fmt: skip
    apps, _ = _run(
        [smi, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"], 8
    )
    busy = []
    for line in (apps or "").strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2:
            busy.append({"uuid": parts[0], "pid": parts[1]})
    return {"status": "ok", "gpus": found, "busy": busy}


def _ipv4(name: str) -> str | None:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(
                sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode())
            )
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _ipv6_by_interface() -> dict[str, list[str]]:
    found = {}
    try:
        with open("/proc/net/if_inet6") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) >= 6:
                    raw = fields[0]
                    address = ":".join(raw[i : i + 4] for i in range(0, 32, 4))
                    packed = socket.inet_pton(socket.AF_INET6, address)
                    found.setdefault(fields[5], []).append(
                        socket.inet_ntop(socket.AF_INET6, packed)
                    )
    except OSError:
        pass
    return found


def interfaces() -> dict[str, list[str]]:
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        names = sorted(name for _, name in socket.if_nameindex())
    v6 = _ipv6_by_interface()
    result = {}
    for name in names:
        addresses = [a for a in [_ipv4(name)] if a] + v6.get(name, [])
        result[name] = addresses
    return result


def ib_devices() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


def resolve_all(names: list[str], timeout: float) -> dict[str, list[str] | str]:
    """getaddrinfo for every name, in threads, so a slow DNS cannot stall the probe."""
    results = {}

    def one(name: str) -> None:
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
            results[name] = sorted({info[4][0] for info in infos})
        except OSError as err:
            results[name] = "error: " + str(err)

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {name: results.get(name, "error: timed out") for name in names}


def disk_free(path: str | None) -> dict[str, Any]:
    probe = filesystem.nearest_existing(os.path.abspath(path or "."))
    try:
        return {"path": probe, "free_bytes": filesystem.free_bytes(probe)}
    except OSError:
        return {"path": probe, "free_bytes": None}


def file_facts(path: str | None) -> dict[str, Any]:
    if not path:
        return {"path": None, "exists": None, "sha256": None, "size": None}
    if not os.path.isfile(path):
        return {"path": path, "exists": False, "sha256": None, "size": None}
    try:
        sha256 = digest.sha256_of(path)
    except OSError as err:
        return {"path": path, "exists": True, "sha256": None, "size": None, "error": str(err)}
    return {"path": path, "exists": True, "sha256": sha256,
            "size": os.path.getsize(path)}  # fmt: skip


class MainListener:
    """Node 0: hold the main port while the other nodes connect and say who they are.

    Binding is the "port free" test (SO_REUSEADDR, as torch's TCPStore binds);
    each peer sends `hello <hostname>`, and node 0 resolves that hostname, as
    gloo and NCCL will. It prints one `{"listening": ...}` line at once, so the
    head starts the other nodes only then; it stops once every peer came, when
    the head writes `done` on stdin (the others finished) or goes away, or when
    the window ends.
    """

    def __init__(self, port: int, peers: int, window: float) -> None:
        self.port, self.expected, self.window = port, peers, window
        self.result = {"port": port, "free": False, "error": None, "peers": []}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("0.0.0.0", port))
            self.sock.listen(256)
        except OSError as err:
            self.result["error"] = err.strerror or str(err)
            self.sock.close()
            self.thread = None
            print(json.dumps({"listening": False, "error": self.result["error"]}), flush=True)
            return
        self.result["free"] = True
        self.done = threading.Event()
        threading.Thread(target=self._wait_for_head, daemon=True).start()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        print(json.dumps({"listening": True, "error": None}), flush=True)

    def _wait_for_head(self) -> None:
        # "done", or EOF: the head went away, so free the port at once for the next job.
        with contextlib.suppress(OSError, ValueError):
            sys.stdin.readline()
        self.done.set()

    def _serve(self) -> None:
        deadline = time.monotonic() + self.window
        self.sock.settimeout(0.1)
        while (
            len(self.result["peers"]) < self.expected
            and not self.done.is_set()
            and time.monotonic() < deadline
        ):
            try:
                conn, address = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    hello = conn.recv(512).decode(errors="replace").split()
                except OSError:
                    hello = []
            name = hello[1] if len(hello) > 1 and hello[0] == "hello" else None
            self.result["peers"].append({"hostname": name, "address": address[0]})
        self.sock.close()

    def finish(self) -> dict[str, Any]:
        if self.thread is not None:
            self.thread.join(self.window + 1)
        names = sorted({p["hostname"] for p in self.result["peers"] if p["hostname"]})
        names.append(socket.gethostname())
        self.result["hostnames"] = resolve_all(sorted(set(names)), 3.0)
        return self.result


class MainConnector:
    """Every other node: connect to the main address and port, retrying until the window ends."""

    def __init__(self, address: str, port: int, window: float) -> None:
        self.address, self.port, self.window = address, port, window
        self.result = {"address": address, "port": port, "ok": False, "error": None}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self.window
        hello = ("hello " + socket.gethostname() + "\n").encode()
        while True:
            remaining = deadline - time.monotonic()
            try:
                with socket.create_connection((self.address, self.port), max(0.2, remaining)) as c:
                    c.sendall(hello)
                self.result.update(ok=True, error=None)
                return
            except OSError as err:
                self.result["error"] = err.strerror or str(err) or type(err).__name__
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)  # node 0 may not be listening yet

    def finish(self) -> dict[str, Any]:
        self.thread.join(self.window + 1)
        return self.result


def stacks_facts(job_python: str | None) -> dict[str, Any]:
    """Whether `orch stacks` can read the ranks' stacks here: py-spy (beside the job's
    interpreter, beside this one, or on PATH, as remote/stacks.py looks), and ptrace."""
    py_spy = None
    for directory in (os.path.dirname(job_python or ""), os.path.dirname(sys.executable)):
        candidate = os.path.join(directory, "py-spy")
        if directory and os.access(candidate, os.X_OK):
            py_spy = candidate
            break
    scope = None
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as handle:
            scope = int(handle.read().strip())
    except (OSError, ValueError):
        pass  # no Yama: classic ptrace rules (same user, or root)
    cap_sys_ptrace = False
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("CapEff:"):
                    cap_sys_ptrace = bool(int(line.split()[1], 16) >> 19 & 1)
    except (OSError, ValueError):
        pass
    return {
        "py_spy": py_spy or shutil.which("py-spy"),
        "ptrace_scope": scope,
        "root": os.geteuid() == 0,
        "cap_sys_ptrace": cap_sys_ptrace,
    }


def own_directories(root: str = "") -> list[dict[str, str]]:
    """Whether the user's own directory for orch (/tmp/orch-<uid>, or `root`, the user's
    ORCH_NODE_ROOT) can be made and used here where a launch needs it: the jobs' node
    directories (runs/) and the port reservations (ports/), each made and checked as a launch
    does, and a file made and removed in it. One fact per place: its path, and what is
    wrong (`problem`, `fix`) or nothing; `instead_of` and `why` when another user's
    /tmp/orch-<uid> made orch choose another place ($XDG_RUNTIME_DIR/orch)."""
    uid = os.getuid()
    choice = owned.choose_directory(uid, root)
    return [_usable(what, choice, below, uid, root)
            for what, below in (("runs", agent_spec.RUNS_DIR), ("ports", ports.PORTS_DIR))]


def _usable(what: str, choice: owned.Choice, below: str, uid: int, root: str) -> dict[str, str]:
    path = os.path.join(choice.path, below)
    fact = {"what": what, "path": path}
    if choice.passed_over is not None:
        fact.update(instead_of=owned.default_directory(uid), why=choice.passed_over.message)
    try:
        owned.user_directories(uid, [below], root)
        # pid and random: nodes in their own pid namespaces may share one /tmp
        trial = os.path.join(path, f".orch-doctor-{os.getpid()}-{os.urandom(6).hex()}")
        os.close(os.open(trial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(trial)
    except owned.UnsafeDirectory as err:
        fact.update(problem=err.problem.message, fix=err.problem.fix)
    except OSError as err:
        place = f"the parent of {owned.ROOT_SETTING} ({root})" if root else "/tmp"
        fact.update(problem=f"{err.filename or path}: {err.strerror or err}",
                    fix=f"check that you can create files in {place} on this node (/tmp is "
                        "normally mode 1777) and that it is not full")  # fmt: skip
    return fact


def os_name() -> str:
    try:
        with open("/etc/os-release") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def probe(request: dict[str, Any]) -> dict[str, Any]:
    main = request.get("main") or {}
    listener = connector = None
    if main.get("role") == "listen":
        listener = MainListener(int(main["port"]), int(main["peers"]), float(main["window"]))
    elif main.get("role") == "connect":
        connector = MainConnector(main["address"], int(main["port"]), float(main["window"]))
    workdir = request.get("workdir")
    names = request.get("names") or []
    interpreter_found = request.get("interpreter_found", True)
    facts = {
        "probe_version": PROBE_VERSION,
        "hostname": socket.gethostname(),
        "os": os_name(),
        "kernel": platform.release(),
        "python": {
            "requested": request.get("python"),
            "found": interpreter_found,
            "executable": sys.executable,
            "version": platform.python_version(),
        },
        "packages": package_versions() if interpreter_found else {},
        "torch_cuda": torch_cuda_version() if interpreter_found else None,
        "environment": environment.environment() if interpreter_found else None,
        "gpu": gpus(),
        "disk": disk_free(workdir),
        "workdir": {"path": workdir, "exists": bool(workdir) and os.path.isdir(workdir)},
        "script": file_facts(request.get("script")),
        "interfaces": interfaces(),
        "ib_devices": ib_devices(),
        "resolve": resolve_all(names, float(request.get("resolve_timeout", 3.0))),
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
        "cpu_count": os.cpu_count(),
        "stacks": stacks_facts(request.get("python")),
        "own_dirs": own_directories(str(request.get("node_root") or "")),
    }
    if listener is not None:
        facts["main_listen"] = listener.finish()
    if connector is not None:
        facts["main_connect"] = connector.finish()
    return facts


def main(argv: list[str]) -> None:
    request = json.loads(argv[0]) if argv else {}
    if "--interpreter-missing" in argv[1:]:
        request["interpreter_found"] = False
    print(json.dumps(probe(request), sort_keys=True, separators=(",", ":")))


if __name__ == "__main__":
    main(sys.argv[1:])
