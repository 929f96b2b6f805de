#!/usr/bin/env bash
# GPU calls of session 3 (bundle unpacked at $B, logs under $OUT):
#   bash run5.sh B OUT tests   every test binary with FL_REQUIRE_GPU=1, memcheck of the f32 prefill
#   bash run5.sh B OUT bench   transformers check (f16, bf16, f32), fl bench fused-norm A/B and
#                              --quant rows, optable vs torch for softmax / embedding variants
B="$1"; OUT="$2"; shift 2; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FL_REQUIRE_GPU=1
for sec in "$@"; do case "$sec" in
tests)
  pass=0; fail=0
  for t in "$B"/tests/*; do
    n=$(basename "$t"); timeout 240 "$t" --test-threads=2 > "$OUT/test-$n.log" 2>&1; rc=$?
    r=$(grep -E '^test result' "$OUT/test-$n.log" | awk '{p+=$4; f+=$6} END {print p+0, f+0}')
    pass=$((pass + ${r% *})); fail=$((fail + ${r#* }))
    [ $rc != 0 ] && { echo "$n rc=$rc"; grep -E "panicked|FAILED|failed" "$OUT/test-$n.log" | head -6; }
  done
  echo "TESTS: $pass passed, $fail failed"
  timeout 120 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__attention_prefill" prefill_f32_gqa --test-threads=1 2>&1 | tail -2 ;;
check)
  timeout 400 python3 "$B/scripts/check_transformers.py" --fl "$B/bin/fl" --workdir /tmp/flcheck > "$OUT/check.log" 2>&1
  echo "check rc=$?"; grep -E "PASS|FAIL|rel|greedy" "$OUT/check.log" | tail -30 ;;
flbench)
  timeout 200 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128,16:1024:64,64:1024:64,16:4032:64,1:2048:2,16:512:2 2>&1 | grep -E "^batch|decode:|prefill:|floor" | tee "$OUT/fl-bench.log"
  echo "== FL_GEMV_NORM=0"; FL_GEMV_NORM=0 timeout 100 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128 2>&1 | grep -E "decode:|floor" ;;
quant)
  for q in int8 int4 q4_0 w8a8; do echo "== --quant $q"
    timeout 150 "$B/bin/fl" bench --model llama-2-7b --quant $q --runs 1:128:64,16:512:32 2>&1 | grep -E "^batch|decode:|prefill:|floor|rror" | tail -6; done ;;
ops)
  for v in cluster twopass; do echo "== FL_SOFTMAX_LONG=$v"
    FL_SOFTMAX_LONG=$v timeout 200 python3 "$B/scripts/compare.py" "$B/bin/optable" softmax 2>&1 | grep -vE "Warning|warn" | tail -16; done
  for v in rows tiles; do echo "== FL_EMBEDDING_PATH=$v"
    FL_EMBEDDING_PATH=$v timeout 120 python3 "$B/scripts/compare.py" "$B/bin/optable" embedding 2>&1 | grep -vE "Warning|warn" | tail -8; done ;;
gtest)
  timeout 200 "$B/tests/fl-kernels__gemv_dense" --test-threads=2 2>&1 | grep -E "test result|panicked|FAILED" | head -5
  RUST_BACKTRACE=1 timeout 200 "$B/tests/fl-engine__quant_gpu" quantised_decode --nocapture 2>&1 | grep -vE "^\s+[0-9]+: |^\s+at " | tail -15
  timeout 100 "$B/bin/fl" bench --model tiny --quant int8 --runs 1:32:8 2>&1 | tail -4 ;;
kbench)
  timeout 200 "$B/benches/gemv_dense" --bench 2>&1 | grep -E "^gemv_dense" ;;
esac; done
