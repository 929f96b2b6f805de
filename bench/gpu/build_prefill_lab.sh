#!/usr/bin/env bash
# Builds the prefill attention (both paths) into a shared library for bench/scripts/prefill_lab.py:
#     bash bench/gpu/build_prefill_lab.sh OUT.so [extra nvcc flags, e.g. -DSOMETHING=1]
# sm_90a only, cudart static; needs nvcc on PATH (source scripts/setup-cuda.sh).
set -euo pipefail
here="$(pwd)"; cd "$(dirname "$0")/../../kernels"
out="$(cd "$here" && realpath -m "$1")"; shift
lib="$(dirname "$(dirname "$(command -v nvcc)")")/lib"
nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Xcompiler -fPIC,-fno-gnu-unique -shared -Iinclude -I. \
  "$@" attention_prefill.cu attention_prefill_wgmma.cu status.cu -L"$lib" -o "$out"
