#!/usr/bin/env bash
# Builds dump_logits against a llama.cpp build (a folder with lib/ holding libllama.so.0 and
# libggml*.so.0, as .gpu/llama from the llama-cpp-python 0.3.36 sources) and that release's
# headers (llama.cpp's include/ and ggml/include/), into LLAMA/bin, with an RPATH to LLAMA/lib:
#     bash bench/llamacpp/build.sh LLAMA LLAMA_SRC
# Needs only g++ (no CUDA): the tool links to the shared libraries the build already has.
set -euo pipefail
LLAMA="$(cd "$1" && pwd)"; SRC="$(cd "$2" && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
for l in llama ggml ggml-base; do ln -s "$LLAMA/lib/lib$l.so.0" "$tmp/lib$l.so"; done
g++ -O2 -std=c++17 "$(dirname "$0")/dump_logits.cpp" -I"$SRC/include" -I"$SRC/ggml/include" \
  -L"$tmp" -lllama -lggml -lggml-base -Wl,-rpath,'$ORIGIN/../lib' -Wl,--allow-shlib-undefined \
  -static-libstdc++ -static-libgcc -o "$LLAMA/bin/dump_logits"
echo "$LLAMA/bin/dump_logits"
