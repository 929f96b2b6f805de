#!/usr/bin/env bash
# The main job, with nothing to download: builds `fl` and runs on GPU 0
#   1. `fl demo`: the elementwise kernels checked against their CPU references and timed
#      (arguments to this script go to it, e.g. --n 1048576);
#   2. `fl generate` on the `tiny` preset: a 2-layer model with dummy weights and no
#      tokenizer, so the prompt is given and the output printed as token ids (the ids are
#      meaningless; the line on stderr gives prefill time and decode tokens/s);
#   3. `fl bench` on the `llama-2-7b` preset (dummy weights, f16): prefill and decode
#      tokens/s and the percent of the memory-bandwidth floor, at batch 1 (prompt 128,
#      128 new tokens) and batch 16 (prompt 512, 64 new tokens), on one load.
# On a machine without a GPU, step 1 says so in one line and the script exits with status 2.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-cuda.sh >/dev/null
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/fasterllama/target}"
cargo build --release -q -p fl-engine --bin fl
fl="$CARGO_TARGET_DIR/release/fl"

"$fl" demo "$@"

echo
echo "== fl generate --model tiny (dummy weights; token ids in, token ids out)"
"$fl" generate --model tiny --prompt-ids 1,15,27,42,99,7,3,64 --max-new-tokens 32 --print-ids

echo
echo "== fl bench --model llama-2-7b (dummy weights, f16)"
"$fl" bench --model llama-2-7b --runs 1:128:128,16:512:64
