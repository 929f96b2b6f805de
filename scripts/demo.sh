#!/usr/bin/env bash
# The main job: builds and runs `fl demo` (GPU kernels checked against the CPU and timed).
# On a machine without a GPU it says so in one line and exits with status 2.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-cuda.sh >/dev/null
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/fasterllama/target}"
cargo build --release -q -p fl-engine --bin fl
exec "$CARGO_TARGET_DIR/release/fl" demo "$@"
