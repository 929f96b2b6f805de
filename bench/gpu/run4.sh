#!/usr/bin/env bash
# One GPU call: new-kernel tests, memcheck of the GQA decode kernel, the transformers check,
# fl bench, the decode-attention bench and torch's prefill attention side by side.
B="$1"; OUT="$2"; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FL_REQUIRE_GPU=1
for t in fl-kernels__attention fl-kernels__gemv_dense fl-engine__engine_gpu fl-kernels__gemv; do
  timeout 200 "$B/tests/$t" --test-threads=2 > "$OUT/t.log" 2>&1; echo "$t rc=$? $(grep -E '^test result' "$OUT/t.log" | tail -1)"
  grep -E "panicked|FAILED" "$OUT/t.log" | head -5
done
timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__attention" gqa --test-threads=1 2>&1 | tail -3
timeout 200 python3 "$B/scripts/check_transformers.py" --fl "$B/bin/fl" --workdir /tmp/flcheck 2>&1 | grep -vE "Warning|Writing|deprecated" | tail -9
timeout 240 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128,16:1024:64,64:1024:64,16:4032:64,1:2048:2,16:512:2 2>&1 | grep -E "^batch|decode:|prefill:"
echo "== attention bench"; timeout 120 "$B/benches/attention" --bench --warm-up-time 0.2 --measurement-time 0.4 2>&1 | grep -E "GB/s|TB/s|%" | grep -vE "^\s+(time|thrpt)" | head -30
echo "== torch prefill"; timeout 100 python3 "$B/scripts/torch_attention_prefill.py" 2>&1 | grep -E "^\| attn|GPU" | head -60
