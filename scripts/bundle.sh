#!/usr/bin/env bash
# Builds the release test binaries, bench binaries and the `fl` binary into a bundle folder
# (default .bundle/, ignored by git) that runs on a GPU machine with only the NVIDIA driver
# (and, for fl-blas, the cuBLAS libraries):
#     bash scripts/bundle.sh [DIR]
#     # copy DIR to the GPU machine, then there:
#     bash DIR/run-bundle.sh            # all tests with FL_REQUIRE_GPU=1; last line "N passed, N failed"
#     bash DIR/run-bundle.sh --bench    # then every criterion bench as well
# FL_CUDA_ARCHS narrows the targets (default: every supported one). FL_BUNDLE_BENCHES=0 leaves
# the criterion benches out (they are most of the bundle's size).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.bundle}"
source scripts/setup-cuda.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/fasterllama/target}"

rm -rf "$DIR"; mkdir -p "$DIR/tests" "$DIR/benches" "$DIR/bin" "$DIR/scripts"
json="$(mktemp)"
cargo test --workspace --release --no-run --message-format=json-render-diagnostics > "$json"
if [ "${FL_BUNDLE_BENCHES:-1}" != 0 ]; then
  cargo bench --workspace --no-run --message-format=json-render-diagnostics >> "$json"
fi
cargo build --release -p fl-engine --bin fl -p fl-bench --bin optable --bin fl_loadgen --message-format=json-render-diagnostics >> "$json"
python3 - "$json" "$DIR" <<'PY'
import json, os, shutil, sys
src, out = sys.argv[1], sys.argv[2]
seen = set()
for line in open(src):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]; exe = m["executable"]
    kind = t["kind"][0]
    if kind == "bench":
        dest = os.path.join(out, "benches", t["name"])
    elif kind == "bin" and not m["profile"].get("test"):
        dest = os.path.join(out, "bin", t["name"])
    elif m["profile"].get("test"):
        pkg = os.path.basename(os.path.dirname(m["manifest_path"]))
        name = t["name"].replace("-", "_")
        dest = os.path.join(out, "tests", f"{pkg}__{name}")
    else:
        continue
    if dest in seen:
        continue
    seen.add(dest)
    shutil.copy2(exe, dest)
print(f"bundle: {len(seen)} binaries in {out}")
PY
rm -f "$json"
# Symbols are not needed on the GPU machine and the bundle must stay small to travel.
strip --strip-unneeded "$DIR"/tests/* "$DIR"/benches/* "$DIR"/bin/* 2>/dev/null || true
cp scripts/run-bundle.sh bench/gpu/run.sh bench/gpu/read_floor.cu "$DIR/"  # run.sh: the GPU runner
cp -r bench/scripts/. "$DIR/scripts/" 2>/dev/null || true
du -sh "$DIR"
