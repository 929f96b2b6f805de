#!/usr/bin/env bash
# The project's test command (README; .ci/run calls it). Needs only the Rust toolchain:
# when no nvcc is found it installs the pinned CUDA 13.0 compiler wheels into
# ~/.cache/fasterllama (and libclang for bindgen) first.
#
# Builds every crate (so every kernel compiles for every target architecture), runs all
# tests: CPU references, proptests, parsers; GPU tests run when a GPU is present and print
# a SKIP notice otherwise (FL_REQUIRE_GPU=1 turns a missing GPU into a failure). Also
# rustfmt --check (first; skipped with a notice where rustfmt is missing), the dependency
# rule (scripts/check-deps.sh), clippy (-D warnings) and rustdoc (warnings are errors).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-cuda.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/fasterllama/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

echo "== fmt"
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all -- --check
else
  echo "SKIP fmt: rustfmt is not installed (rustup component add rustfmt)"
fi
echo "== deps"
bash scripts/check-deps.sh
echo "== build (FL_CUDA_ARCHS=${FL_CUDA_ARCHS:-all supported})"
cargo build --workspace --all-targets --locked
echo "== bench/gpu/read_floor.cu (a standalone probe the GPU calls build with nvcc: compiled here so it keeps building)"
nvcc -O3 -std=c++17 -arch=sm_90a -c bench/gpu/read_floor.cu -o "$CARGO_TARGET_DIR/read_floor.o"
echo "== clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
echo "== tests"
cargo test --workspace --locked 2>&1 | tee "$CARGO_TARGET_DIR/last-test.log"
python3 - "$CARGO_TARGET_DIR/last-test.log" <<'PY'
import re, sys
p = f = 0
for line in open(sys.argv[1]):
    m = re.match(r"test result: \w+\. (\d+) passed; (\d+) failed", line)
    if m:
        p += int(m.group(1)); f += int(m.group(2))
# (anywhere in a line: tests run in parallel, and a notice on stderr can land inside the test
# harness's stdout line, even before the test's name)
skips = sum(len(re.findall(r"\bSKIP ", l)) for l in open(sys.argv[1]))
print(f"{p} passed, {f} failed" + (f" ({skips} GPU tests skipped: no GPU)" if skips else ""))
PY
