#!/usr/bin/env bash
# GPU calls of session 4 (bundle unpacked at $B, logs under $OUT):
#   tests   every test binary with FL_REQUIRE_GPU=1 (programmatic dependent launch on)
#   ab      fl bench llama-2-7b batch 1: PDL on/off x fused norm on/off, then the full rows
#   ops     optable vs torch for the softmax long-row and embedding variants
#   check   transformers check (f16, bf16, f32)
B="$1"; OUT="$2"; shift 2; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FL_REQUIRE_GPU=1
for sec in "$@"; do case "$sec" in
tests)
  pass=0; fail=0
  for t in "$B"/tests/*; do
    n=$(basename "$t"); timeout 200 "$t" --test-threads=2 > "$OUT/test-$n.log" 2>&1; rc=$?
    r=$(grep -E '^test result' "$OUT/test-$n.log" | awk '{p+=$4; f+=$6} END {print p+0, f+0}')
    pass=$((pass + ${r% *})); fail=$((fail + ${r#* }))
    [ $rc != 0 ] && { echo "$n rc=$rc"; grep -E "panicked|FAILED|failed" "$OUT/test-$n.log" | head -6; }
  done
  grep -h "capture invalidated" "$OUT"/test-*.log | head -3
  echo "TESTS: $pass passed, $fail failed" ;;
ab)
  for pdl in 1 0; do for nm in 1 0; do
    r=$(FL_PDL=$pdl FL_GEMV_NORM=$nm timeout 100 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128 2>&1 | grep -E "decode:")
    echo "FL_PDL=$pdl FL_GEMV_NORM=$nm $r"; done; done
  timeout 200 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128,16:1024:64,64:1024:64,16:4032:64,1:4032:64,1:2048:2,16:512:2 2>&1 | grep -E "^batch|decode:|prefill:" | tee "$OUT/fl-bench.log" ;;
ops)
  for v in cluster twopass; do echo "== FL_SOFTMAX_LONG=$v"
    FL_SOFTMAX_LONG=$v timeout 200 python3 "$B/scripts/compare.py" "$B/bin/optable" softmax 2>&1 | grep -vE "Warning|warn" | tail -17; done
  for v in rows tiles; do echo "== FL_EMBEDDING_PATH=$v"
    FL_EMBEDDING_PATH=$v timeout 120 python3 "$B/scripts/compare.py" "$B/bin/optable" embedding 2>&1 | grep -vE "Warning|warn" | tail -8; done ;;
check)
  timeout 400 python3 "$B/scripts/check_transformers.py" --fl "$B/bin/fl" --workdir /tmp/flcheck > "$OUT/check.log" 2>&1
  echo "check rc=$?"; grep -E "PASS|FAIL" "$OUT/check.log" | tail -8 ;;
esac; done
