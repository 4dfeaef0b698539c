#!/usr/bin/env bash
# Set up everything orch needs on a Debian/Ubuntu machine that has only Python:
# system packages (OpenSSH, pdsh, Chromium for the report's tests), a virtual
# environment in .venv with a pinned torch build, DeepSpeed, accelerate and orch
# itself. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${ORCH_TORCH_SPEC:-torch==2.13.0}
DEEPSPEED_SPEC=${ORCH_DEEPSPEED_SPEC:-deepspeed==0.19.8}

log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

# orch reads its defaults files with tomllib (3.11): say so before installing anything.
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    log "orch needs Python 3.11 or newer; $PYTHON is $("$PYTHON" --version 2>&1): PYTHON=python3.11 bash $0"
    exit 1
fi

need_pkgs=()
command -v ssh >/dev/null || need_pkgs+=(openssh-client)
{ command -v sshd >/dev/null || [ -x /usr/sbin/sshd ]; } || need_pkgs+=(openssh-server)
command -v pdsh >/dev/null || need_pkgs+=(pdsh)
command -v ip >/dev/null || need_pkgs+=(iproute2)
command -v ps >/dev/null || need_pkgs+=(procps)
command -v unshare >/dev/null || need_pkgs+=(util-linux)
command -v git >/dev/null || need_pkgs+=(git)
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
# `orch sandbox up --slurm`: a real Slurm (controller, one slurmd per node, munge auth).
command -v slurmctld >/dev/null || need_pkgs+=(slurmctld)
command -v slurmd >/dev/null || need_pkgs+=(slurmd)
command -v srun >/dev/null || need_pkgs+=(slurm-client)
command -v munged >/dev/null || need_pkgs+=(munge)
# The tests render each job's report.html in a real browser (headless).
command -v chromium >/dev/null || need_pkgs+=(chromium)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    log "installing system packages: ${need_pkgs[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    log "creating .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
# torch first and pinned: anything later that asks for `torch` finds it satisfied
# instead of pulling a multi-GB CUDA build.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    log "installing $TORCH_SPEC"
    "${PIP[@]}" install "$TORCH_SPEC"
fi
if ! .venv/bin/python -c 'import deepspeed' 2>/dev/null; then
    log "installing $DEEPSPEED_SPEC (no prebuilt ops; built against the installed torch)"
    "${PIP[@]}" install setuptools wheel
    DS_BUILD_OPS=0 "${PIP[@]}" install --no-build-isolation "$DEEPSPEED_SPEC"
fi
log "installing orch and its dependencies"
# Until 0.1 the distribution was named "orch" (another project's name on the index).
"${PIP[@]}" uninstall -y orch >/dev/null 2>&1 || true
"${PIP[@]}" install -e ".[train,test,docs]"
# orch is installed editable, so pip compiled none of it: wherever PYTHONDONTWRITEBYTECODE
# is set, every orch command would compile the package again (0.2 to 0.5 s of CPU each).
# Compile it once; Python still compiles again a file changed since.
.venv/bin/python -m compileall -q -j 0 orchestrator >/dev/null
# Without a GPU, DeepSpeed's CPU accelerator JIT-compiles its shared-memory op on
# the first run of every fresh machine (minutes on 2 cores). Build it once here,
# into the cache recipes/scripts/cpu_smoke.py uses, with the venv's ninja.
if ! .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    log "building DeepSpeed's CPU communication op (once per machine)"
    ext_dir="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/orch/torch_extensions}"
    # A build killed half-way leaves torch's lock file behind, and every later build (this
    # one, a rank's) waits on it forever. A build under way holds the file open.
    for lock in "$ext_dir"/*/*/lock; do
        [ -e "$lock" ] || continue
        if [ -z "$(find /proc/[0-9]*/fd -lname "$lock" 2>/dev/null | head -n 1)" ]; then
            rm -f "$lock" && log "removed $lock, left by a build that did not finish"
        fi
    done
    PATH="$PWD/.venv/bin:$PATH" DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR="$ext_dir" \
        timeout 1800 .venv/bin/python -c 'from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder as B; B().load(verbose=False)' \
        >/dev/null 2>&1 || log "warning: prebuilding the op failed; the first training run will build it"
fi
log "ready: $(.venv/bin/orch --version 2>/dev/null || echo orch) in .venv (activate: source .venv/bin/activate)"
