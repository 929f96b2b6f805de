#!/usr/bin/env bash
# GPU-machine run of the engine checks and benches from a bundle (scripts/bundle.sh):
#   bash bench/gpu/engine_run.sh BUNDLE_DIR OUT_DIR [tests|check|bench|profile|torch]...
# Sections (default: tests check bench): engine and new-kernel GPU tests; the transformers
# check; `fl bench` on llama-2-7b dummy weights; `ab`: the same with the dense GEMV off;
# `kbench`: criterion benches; a per-kernel profile of decode steps (nsys when present, else
# ncu); transformers' generate on the same shapes.
set -uo pipefail
B="$(cd "$1" && pwd)"; OUT="$2"; shift 2
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FL_REQUIRE_GPU=1
RUNS="${FL_BENCH_RUNS:-1:128:128,16:1024:64,64:1024:64,16:4096:64,64:4096:64,1:2048:2,16:512:2}"
for s in "${@:-tests check bench}"; do for sec in $s; do case "$sec" in
tests)
  for t in "$B"/tests/*; do
    n=$(basename "$t"); timeout 300 "$t" --test-threads=2 > "$OUT/test-$n.log" 2>&1
    echo "$n: rc=$? $(grep -E '^test result' "$OUT/test-$n.log" | tail -1)"
    grep -E "panicked|FAILED" "$OUT/test-$n.log" | head -5
  done ;;
check)
  timeout 500 python3 "$B/scripts/check_transformers.py" --fl "$B/bin/fl" --workdir /tmp/flcheck \
    > "$OUT/check.log" 2>&1; echo "check rc=$?"; grep -vE "Warning|Writing|deprecated" "$OUT/check.log" | tail -12 ;;
bench)
  timeout 550 "$B/bin/fl" bench --model llama-2-7b --runs "$RUNS" 2>&1 | tee "$OUT/fl-bench.log" ;;
profile)
  if command -v nsys >/dev/null; then
    timeout 300 nsys profile -o /tmp/flprof --force-overwrite true "$B/bin/fl" bench --model llama-2-7b \
      --batch 1 --prompt-len 64 --gen-len 32 --no-graph > /dev/null 2>&1
    nsys stats --report cuda_gpu_kern_sum --format csv /tmp/flprof.nsys-rep > "$OUT/prof.csv" 2>/dev/null
    head -25 "$OUT/prof.csv"
  else
    timeout 400 ncu --metrics gpu__time_duration.sum --print-summary per-kernel --launch-skip 2200 \
      --launch-count 420 "$B/bin/fl" bench --model llama-2-7b --batch 1 --prompt-len 16 --gen-len 8 \
      --no-graph > "$OUT/prof.txt" 2>&1; echo "ncu rc=$?"
    grep -E "^\s+[a-z_].*\(|gpu__time_duration|Invocations" "$OUT/prof.txt" | head -80
  fi ;;
ab)
  # The same decode with the dense GEMV off (cuBLASLt for every projection).
  FL_GEMV_MAX_M=0 timeout 300 "$B/bin/fl" bench --model llama-2-7b --runs "${FL_AB_RUNS:-1:128:128,16:1024:64}" 2>&1 | tee "$OUT/fl-bench-cublas.log" ;;
kbench)
  # Criterion benches named in FL_KBENCH (default: the kernels new this session).
  for b in ${FL_KBENCH:-gemv_dense gemv attention attention_prefill kv_cache quant}; do
    [ -x "$B/benches/$b" ] || continue
    echo "== bench $b"
    timeout 400 "$B/benches/$b" --bench 2>&1 | grep -vE '^(Gnuplot|Benchmarking|Found|  [0-9]+ \(|Warning|$)' \
      | grep -vE "^\s+(time|thrpt|change):|^(Performance|No change|Change within)" > "$OUT/bench-$b.log"
    tail -60 "$OUT/bench-$b.log"
  done ;;
torch)
  timeout 580 python3 "$B/scripts/torch_generate.py" --runs "${FL_TORCH_RUNS:-1:128:128,16:1024:64,1:2048:2,16:512:2}" \
    --modes "${FL_TORCH_MODES:-eager,compile}" 2>&1 | grep -vE "Warning|warn" | tee "$OUT/torch-generate.log" ;;
esac; done; done
