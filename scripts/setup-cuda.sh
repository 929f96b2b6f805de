#!/usr/bin/env bash
# Installs what a build needs on a machine with only the Rust toolchain:
#   - the CUDA 13.0 compiler from the pinned PyPI wheels, into a venv under ~/.cache
#   - libclang (for bindgen), from Debian's packages, when it is missing
# Prints nothing but progress; safe to run again (a warm cache is reused).
# Source-able: `source scripts/setup-cuda.sh` exports NVCC, CUDA_HOME and PATH.
set -euo pipefail

FL_CACHE="${FL_CACHE:-$HOME/.cache/fasterllama}"
VENV="$FL_CACHE/cuda-venv"
PIN="nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85"
STAMP="$VENV/.fl-pins"

if [ -z "${NVCC:-}" ] && ! command -v nvcc >/dev/null 2>&1 || [ -n "${FL_FORCE_WHEELS:-}" ]; then
  if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$PIN" ]; then
    echo "setup-cuda: installing the pinned CUDA 13.0 compiler wheels into $VENV"
    mkdir -p "$FL_CACHE"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check $PIN
    echo "$PIN" > "$STAMP"
  fi
  CU="$("$VENV/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
  export CUDA_HOME="$CU"
  export NVCC="$CU/bin/nvcc"
  export PATH="$CU/bin:$PATH"
fi

if [ -z "${LIBCLANG_PATH:-}" ] && ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/*/libclang-[0-9]*.so* >/dev/null 2>&1; then
  echo "setup-cuda: installing libclang-dev (bindgen needs it)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libclang-dev >/dev/null
fi

echo "setup-cuda: nvcc = ${NVCC:-$(command -v nvcc)}"
