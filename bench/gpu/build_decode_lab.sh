#!/usr/bin/env bash
# Builds the decode attention, with the lab's tensor-core variants (FL_DECODE_LAB: FL_GQA_MMA
# picks one per call, see kernels/attention_decode.cu), into a shared library for
# bench/scripts/decode_lab.py:
#     bash bench/gpu/build_decode_lab.sh OUT.so [extra nvcc flags]
# sm_90a only, cudart static; needs nvcc on PATH (source scripts/setup-cuda.sh).
set -euo pipefail
here="$(pwd)"; cd "$(dirname "$0")/../../kernels"
out="$(cd "$here" && realpath -m "$1")"; shift
lib="$(dirname "$(dirname "$(command -v nvcc)")")/lib"
nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Xcompiler -fPIC,-fno-gnu-unique -shared -Iinclude -I. \
  -DFL_DECODE_LAB "$@" attention_decode.cu status.cu -L"$lib" -o "$out"
