#!/usr/bin/env bash
# GPU calls of session 5 (binaries under $B/{bin,tests}, logs under $OUT):
#   mmadiag  the bf16 engine quant test with the tensor-core GEMV forced (FL_GEMV_PATH=mma)
#   smgrid   optable softmax, long rows, FL_SOFTMAX_LONG cluster / cluster_db x each
#            FL_SOFTMAX_CLUSTER_GRID
#   ncu      per-kernel GPU time of one eager batch-1 decode step of llama-2-7b (ncu, no clock
#            or cache control), summed by kernel name, against the graph step time
#   quantab  fl bench --quant {int8,int4,q4_0,q8_0} with FL_GEMV_PATH=fma / mma / auto
#   prefetch fl bench llama-2-7b with FL_PREFETCH_O_MB = 0 / 8 / 16 / 32 (o weight to L2
#            before RoPE + attention), batch 1 and 4
#   sanitize compute-sanitizer memcheck on the new kernels (prefetch_l2, softmax cluster_db)
#   gtest    the test binaries named in $FL_TESTS (default fl-kernels__gemv)
#   qbench   the gemv bench's own timing lines only (~40 s; valid cuBLAS ratios since session 6)
#   warpsweep batch-1 decode under FL_GEMV_DENSE_WARPS / FL_GEMV_DENSE_NT overrides
#   tests    every test binary under $B/tests with FL_REQUIRE_GPU=1
#   bench1   fl bench llama-2-7b, the issue-7 rows
#   check    bench/scripts/check_transformers.py (f16, bf16, f32 against transformers)
#   ops      optable vs torch (compare.py) for the op families named in $FL_OPS (default
#            "softmax embedding")
#   kbench   the criterion benches named in $FL_KBENCH (default "gemv gemv_dense"), short
#   rope     batch-1/4 decode with RoPE + KV append in the QKV GEMV (FL_FUSE_ROPE=1, the
#            default since session 7) against the separate rope_append kernel (0), alternated
#   splitsweep decode (1 x 128, 1 x 4032, 4 x 512) under FL_ATTN_SPLIT_KEYS / FL_GEMV_DENSE_WARPS
#   dbench   the gemv_dense bench's own summary lines only (criterion's runs filtered out)
#   normab   batch-1 decode with the RMSNorms fused into the GEMVs (default) or not
#            (FL_GEMV_NORM=0), alternated; the attention tests with 16-key splits
#   torchgen bench/scripts/torch_generate.py on the issue-7 rows (eager and compiled)
#   subtests the test binaries in $FL_TESTS one by one, a line each, stopping after $FL_TEST_BUDGET s
#   wgmma    the Hopper prefill attention: the wgmma probes, the prefill tests on both paths
#            (FL_PREFILL_PATH=auto, the default, and mma) and memcheck on the default
#   pbench   the prefill bench on both paths, and fl bench's prefill rows on both
#   decode   the decode attention (issue 6): its GPU tests, memcheck on the paged and GQA
#            tests, bench/scripts/decode_lab.py ($B/lab/decode.so, check + bench beside torch)
#            and compare.py's decode_attn table
#   s10      session 10: the int8/int4 one-token GEMV (gemv_t1_kernel): the GEMV and engine
#            quantised tests; s10m memcheck on it; s10p the gemv bench's m = 1 lines under each
#            FL_GEMV_T1 configuration and llama-2-7b --quant int4 / int8 with it on and off
#   s11      session 11: the one-token GEMV kernel with cp.async staging: tests (lab
#            configurations in FL_T1_TEST_CONFIGS), s11m memcheck, s11p the gemv bench's m = 1
#            lines per configuration, s11e llama-2-7b int4 / int8 decode; s11s softmax tests and
#            optable's softmax rows
#   s12      session 12: the GGUF one-token GEMV (gemv_t1g_kernel): tests (lab configurations
#            in FL_T1G_TEST_CONFIGS), s12m memcheck, s12p the gemv bench's m = 1 Q8_0 / Q4_0
#            lines per FL_GEMV_T1G configuration, s12e llama-2-7b q4_0 / q8_0 decode, s12n ncu
#            of one launch of each one-token kernel, s12f everything on the final code
#   s13      session 13: the GGUF GEMV for 2..16 tokens (gemv_tmg_kernel): tests (lab
#            configurations in FL_TMG_TEST_CONFIGS), s13m memcheck, s13p the gemv bench's Q8_0 /
#            Q4_0 lines at FL_TMG_M tokens per FL_GEMV_TMG configuration, s13e llama-2-7b q4_0 /
#            q8_0 decode at batch 16 with it on and off; s13i the int8 / int4 lines per
#            FL_GEMV_TMI configuration (gemv_tmi_kernel)
#   s14      session 14: the GEMV tests, and the lab variants of the session's experiments under
#            FL_TMI_TEST_CONFIGS / FL_T1_TEST_CONFIGS / FL_T1G_TEST_CONFIGS; s14b the m = 1 A/B of
#            FL_T1_CONFIGS and FL_T1G_CONFIGS; s14n ncu of one launch per optable key in
#            FL_NCU_KEYS (kernel:key), with stall reasons; s14c pairs of warps per ring in the GGUF
#            kernels: tests, then m = 1 and multi-token A/B; s14f the final code's tests, memcheck
#            and multi-token table; s14e llama-2-7b batch-16 decode, pairs on / off
#   s15      session 15: the bulk-copy one-token GGUF kernel (gemv_t1b_kernel): tests and memcheck
#            under FL_GEMV_T1B variants, then the m = 1 A/B per FL_T1B_CONFIGS; s15f the final
#            code's one-token GEMV tests (memcheck) and engine tests, the m = 1 table, llama-2-7b
#            q8_0 / q4_0 decode with it on / off
#   s16      session 16: the TMA-fed one-token int kernel (gemv_t1t_kernel) and the refactored GGUF
#            one-token kernels: the GEMV tests whole, memcheck of the one-token tests under
#            FL_T1T_MEMCHECK, the one-token int tests under each FL_GEMV_T1T in
#            FL_T1T_TEST_CONFIGS, the GGUF one-token test with FL_GEMV_T1B=0, the engine GPU
#            tests; s16p the m = 1 int lines per FL_T1T_CONFIGS and the GGUF lines per
#            FL_T1B_CONFIGS; s16f the final code: memcheck of the one-token int tests, the GEMV
#            tests whole, the one-token int tests under FL_GEMV_T1T 0 and lab 2-5 (lab 5 three
#            times), the engine GPU tests (summary in a-summary.txt), the m = 1 int lines with
#            FL_GEMV_T1T 1 / 0 twice; s16t the several-host-threads test per FL_GEMV_T1T; s16e llama-2-7b int8 batch-1 decode with FL_GEMV_T1T 1 / 0
#   s17      session 17: int4's product in the one-token kernel (FL_GEMV_T1_INT4): memcheck and
#            tests of mode FL_S17_MODE (each of t1's int4 kernels forced), the m = 1 int4 lines
#            per mode (FL_S17_MODES), llama-2-7b int4 decode per mode (FL_S17_DECODE); s17n ncu
#            of one launch per mode; s17f the final code: tests, memcheck, m = 1 int4 A/B, decode
#   s18      session 18: the GEMV / quant / engine GPU tests whole, memcheck of the one-token
#            tests, the m = 1 int4 g32 and Q4_0 lines (same bytes per value, FL_GEMV_BENCH_QUICK=q4)
#            per FL_GEMV_T1G_RAW in FL_S18_RAW, the m = 1 int4 lines with FL_GEMV_T1 per
#            FL_S18_T1 (alternated)
#            s18b: the same tests (FL_S18_RAW_TESTS for the one-token tests under
#            FL_GEMV_T1G_RAW), then the m = 1 lines of bundle $FL_S18_A (an earlier build's
#            benches/gemv) against this one's, alternated (FL_S18_AB rounds), and Q4_0 per
#            FL_GEMV_T1G_RAW in FL_S18_RAW
#            s18f: the final code: memcheck of the one-token and multi-token int tests, the
#            GEMV / quant / engine tests (a-summary.txt); the int4 lines of bundle $FL_S18_A
#            against this one's at m = 1 (FL_S18_AB rounds) and at FL_S18_M tokens (one round);
#            the m = 1 table of every format; llama-2-7b int4 / q4_0 decode
#            s18g: the GEMV tests whole (and the one-token GGUF test per FL_GEMV_T1G in
#            FL_T1G_TEST_CONFIGS), the m = 1 int4 / Q4_0 lines (Q4_0 per FL_T1G_CONFIGS), llama-2-7b int4 decode
#            FL_S18_RUNS times and q4_0 once; with FL_S18_A, the int4 lines at FL_S18_M tokens
#            of that bundle against this one's, two rounds
#   s19-s21  sessions 19-21: each section's comment says what it runs (s20f / s21f: the final
#            tests of those sessions; s21a: bench/gpu/read_floor.cu's read-only floor, built as
#            $B/bin/read_floor, beside the int4 one-token lines and ncu of their kernels;
#            s21t: the final one-token table and llama-2-7b int4 / q4_0 decode)
#   lab      bench/scripts/prefill_lab.py on the libraries in $FL_LAB_LIBS (check + bench beside
#            torch's SDPA flash and cuDNN backends)
# Print to stdout as you go (no `| tail`): a call cut at its time limit returns only the
# output already written.
# The one GPU script to extend (runs 4-6 of earlier sessions are in git history: see
# bench/RESULTS.md for the commit of each).
B="$1"; OUT="$2"; shift 2; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FL_REQUIRE_GPU=1
T0=$(date +%s)
# Shared by the sections below (the caller's environment assignments reach the commands):
# run_tests LABEL LOG SECONDS CMD...: CMD into $OUT/LOG.log; LABEL, its exit status, its test
# result line and its first failure lines.
run_tests() {
  local label=$1 log="$OUT/$2.log" t=$3; shift 3
  timeout "$t" "$@" > "$log" 2>&1; local rc=$?
  echo "$label rc=$rc $(grep -E '^test result' "$log" | tail -1)"
  grep -E "panicked|FAILED|failed" "$log" | cut -c1-300 | head -8
}
# shorten: the gemv bench's summary lines, shortened.
shorten() { sed -E 's/ +GB\/s on weights =/ GB\/s =/; s/ of copy \(([0-9]+) GB\/s\)/ (copy \1)/'; }
# quick_bench MODE FORMATS: the gemv bench's one-token lines (FL_GEMV_BENCH_QUICK=MODE) of the
# formats matching the regex FORMATS.
quick_bench() {
  FL_GEMV_BENCH_QUICK=$1 timeout 150 "${FL_GEMV_BIN:-$B/benches/gemv}" --bench no_criterion_match 2>&1 | grep -E "^gemv [0-9]+x[0-9]+ m=1 +($2)" | grep -v fma | shorten
}
# decode_line QUANT: llama-2-7b batch-1 decode with --quant QUANT, on one line.
decode_line() {
  timeout 100 "$B/bin/fl" bench --model llama-2-7b --quant "$1" --runs 1:128:64 2>&1 | grep -E "decode:|rror" | awk '{printf "%s | ", $0}'
}
# m_bench MODE FORMATS MS: the gemv bench's lines at the token counts MS (comma-separated).
m_bench() {
  FL_GEMV_BENCH_QUICK=$1 FL_GEMV_BENCH_M=$3 timeout 200 "$B/benches/gemv" --bench no_criterion_match 2>&1 | grep -E "^gemv [0-9]+x[0-9]+ m=[0-9]+ +($2)" | grep -v fma | shorten
}
# gemv_suite "FILTERS" PREFIX [EXTRA]: memcheck of the GEMV tests matching each filter in the
# background, the GEMV tests whole, the function EXTRA if given, the engine's quantised and
# GPU tests; the summary to stdout and $OUT/a-summary.txt.
gemv_suite() {
  local f
  for f in $1; do
    (timeout 300 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" $f --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck $f: /" > "$OUT/memcheck-$f.txt") &
  done
  {
    run_tests fl-kernels__gemv $2-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
    [ -n "${3:-}" ] && $3
    run_tests fl-engine__quant_gpu $2-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
    run_tests fl-engine__engine_gpu $2-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
    wait; for f in $1; do cat "$OUT/memcheck-$f.txt"; done
  } 2>&1 | tee "$OUT/a-summary.txt"
}
# ab_m1 ROUNDS: the m = 1 int4 lines (g128 / int4zp g128, then g32) of bundle $FL_S18_A and of
# $B, alternated, ROUNDS times.
ab_m1() {
  local r bb
  for r in $(seq "$1"); do
    for bb in "$FL_S18_A" "$B"; do echo "bundle $bb"; B="$bb" quick_bench 1 "int4"; B="$bb" quick_bench q4 "int4"; done
  done
}
# lab_tests VAR CONFIGS FILTER LABEL TAG: the gemv tests matching FILTER under VAR=v for each
# v in CONFIGS (logs TAGv.log).
lab_tests() {
  local var=$1 configs=$2 filter=$3 label=$4 tag=$5 v
  for v in $configs; do
    ( export "$var=$v"; run_tests "$label $var=$v" "$tag$v" 150 "$B/tests/fl-kernels__gemv" "$filter" --test-threads=2 )
  done
}
# lab_runs VAR CONFIGS TAG COMMAND...: COMMAND under VAR=v for each v in CONFIGS, printed and
# logged to TAGv-i.log (i counts the runs, so a configuration may repeat).
lab_runs() {
  local var=$1 configs=$2 tag=$3 v i=0; shift 3
  for v in $configs; do i=$((i + 1)); echo "$var=$v"
    ( export "$var=$v"; "$@" ) > "$OUT/$tag$v-$i.log"; cat "$OUT/$tag$v-$i.log"
  done
}
# decode16_line QUANT: llama-2-7b decode at batch 16 (16 x 512 tokens, 32 steps), one line.
decode16_line() {
  timeout 150 "$B/bin/fl" bench --model llama-2-7b --quant "$1" --runs 16:512:32 2>&1 | grep -E "decode:|rror" | awk '{printf "%s | ", $0}'
}
for sec in "$@"; do echo "== $sec (t=$(( $(date +%s) - T0 )) s)"; case "$sec" in
mmadiag)
  # both paths, so the margins can be compared (the test prints every mode's rel L2)
  for p in fma mma; do
    FL_GEMV_PATH=$p timeout 150 "$B/tests/fl-engine__quant_gpu" --test-threads=1 \
      every_mode_matches_dense_on_its_dequantised_weights_bf16 --nocapture > "$OUT/mmadiag-$p.log" 2>&1
    echo "mmadiag FL_GEMV_PATH=$p rc=$?"
    grep -E "dequantised weights|panicked|test result" "$OUT/mmadiag-$p.log" | cut -c1-300 | head -20
  done ;;
smgrid)
  for v in cluster cluster_db; do for g in default rows resident; do
    if [ $g = default ]; then unset FL_SOFTMAX_CLUSTER_GRID; else export FL_SOFTMAX_CLUSTER_GRID=$g; fi
    for rep in 1 2; do
      FL_SOFTMAX_LONG=$v timeout 60 "$B/bin/optable" softmax 2>&1 | grep -E '(256|2048)x128256|"copy"' | sed -E 's/.*"key":"([^"]*)".*"us":([0-9.]+).*"pct_copy":([0-9.]+).*/\1 \2us \3%;/; s/.*"key":"copy".*"gbps":([0-9.]+).*/copy \1GB\/s;/' | tr '\n' ' ' | sed "s/^/$v grid=$g rep$rep: /" | cut -c1-900; echo
    done
  done; done; unset FL_SOFTMAX_CLUSTER_GRID ;;
ncu)
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 280 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --csv --print-units base "$B/bin/fl" bench --model llama-2-7b --runs 1:128:3 --no-graph \
    > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu.csv")"; tail -3 "$OUT/ncu.err"
  python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = []
for r in csv.reader(open(sys.argv[1])):
    if len(r) > 10 and r[0].isdigit():
        rows.append(r)
hdr = None
for r in csv.reader(open(sys.argv[1])):
    if r and r[0] == "ID": hdr = r; break
if not hdr or not rows: print("no ncu rows"); sys.exit()
ki, vi, mi = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Name")
ks = [(r[ki], float(r[vi].replace(",", ""))) for r in rows if r[mi] == "gpu__time_duration.sum"]
# each step starts with the embedding lookup; take the last complete step
starts = [i for i, (n, _) in enumerate(ks) if "embedding" in n.lower()]
print("kernels", len(ks), "embedding launches", len(starts))
a, b = starts[-2], starts[-1]
step = ks[a:b]
tot = sum(t for _, t in step)
print(f"step (second-to-last): {len(step)} kernels, {tot/1e3:.1f} us of kernel time")
agg = collections.OrderedDict()
for n, t in step:
    key = n.split("(")[0].split("<")[0][-60:] + ("<" + n.split("<")[1][:70] if "<" in n else "")
    c, s, mx, mn = agg.get(key, (0, 0.0, 0.0, 1e18))
    agg[key] = (c + 1, s + t, max(mx, t), min(mn, t))
for k, (c, s, mx, mn) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{s/1e3:9.1f} us {c:4d}x  mean {s/c/1e3:7.2f}  min {mn/1e3:7.2f} max {mx/1e3:7.2f}  {k}")
# first layer in order
print("first 12 kernels of the step:")
for n, t in step[:12]:
    print(f"  {t/1e3:7.2f} us  {n[:150]}")
PY
  ;;
quantab)
  for q in int8 int4 q4_0 q8_0; do for p in fma mma auto; do
    if [ $p = auto ]; then unset FL_GEMV_PATH; else export FL_GEMV_PATH=$p; fi
    r=$(timeout 100 "$B/bin/fl" bench --model llama-2-7b --quant $q --runs 1:128:64,16:512:32 2>&1 | grep -E "decode:|rror" | awk '{printf "%s | ", $0}')
    echo "quant=$q path=$p $r"
  done; done; unset FL_GEMV_PATH ;;
prefetch)
  for mb in 0 8 16 32 0; do
    r=$(FL_PREFETCH_O_MB=$mb timeout 120 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128,1:4032:64,4:512:64 2>&1 | grep -E "decode:|rror" | awk '{printf "%s | ", $0}')
    echo "FL_PREFETCH_O_MB=$mb $r"
  done ;;
sanitize)
  timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__elementwise" prefetch --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2
  FL_SOFTMAX_LONG=cluster_db timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__softmax" softmax_in_place_on_every_long_path --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 ;;
gtest)
  # the test binaries named in $FL_TESTS (default the quantised GEMV's), whole
  for n in ${FL_TESTS:-fl-kernels__gemv}; do
    timeout 250 "$B/tests/$n" --test-threads=2 > "$OUT/gtest-$n.log" 2>&1
    echo "$n rc=$? $(grep -E '^test result' "$OUT/gtest-$n.log" | tail -1)"
    grep -E "panicked|rel L2" "$OUT/gtest-$n.log" | cut -c1-250 | head -8
  done ;;
s10)
  # session 10: the int8 / int4 one-token GEMV kernel (gemv_t1_kernel): the GEMV tests and the
  # engine's quantised tests, whole
  for n in fl-kernels__gemv fl-engine__quant_gpu; do
    timeout 250 "$B/tests/$n" --test-threads=2 > "$OUT/s10-$n.log" 2>&1
    echo "$n rc=$? $(grep -E '^test result' "$OUT/s10-$n.log" | tail -1)"
    grep -E "panicked|FAILED|failed" "$OUT/s10-$n.log" | cut -c1-300 | head -8
  done ;;
s10m)
  # memcheck of the one-token kernel (every format, m = 1..16, f16 and bf16)
  timeout 150 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" gemv_one_token_kernel_on_large_int4_and_int8 --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2
  timeout 100 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" gemv_each_path_matches_reference_every_format --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 ;;
s10p)
  # the gemv bench's one-token lines under each FL_GEMV_T1 configuration (0 = off), then
  # llama-2-7b --quant int4 / int8 decode with the default configuration and off
  for v in ${FL_T1_CONFIGS:-1 2 3 4 0}; do echo "FL_GEMV_T1=$v"
    FL_GEMV_T1=$v timeout 150 "$B/benches/gemv" --bench no_criterion_match 2>&1 | grep -E "^gemv [0-9]+x[0-9]+ m=1 +(int8|int4)" | grep -v fma | tee "$OUT/qbench-t1$v.log"
  done
  if [ -x "$B/bin/fl" ]; then for qv in "int4 1" "int4 0" "int8 1" "int8 0" "int4 1" "int4 0" "int8 1" "int8 0"; do
    read -r q v <<< "$qv"
    r=$(FL_GEMV_T1=$v timeout 100 "$B/bin/fl" bench --model llama-2-7b --quant $q --runs 1:128:64 2>&1 | grep -E "decode:|rror" | awk '{printf "%s | ", $0}')
    echo "$q FL_GEMV_T1=$v $r"
  done; fi ;;
s11)
  # session 11: the one-token GEMV kernels (cp.async staging, persistent gemv_t1p_kernel): the
  # GEMV tests whole (default configuration), the one-token tests under each lab
  # configuration, the engine's quantised tests
  run_tests fl-kernels__gemv s11-gemv 250 "$B/tests/fl-kernels__gemv" --test-threads=2
  for v in ${FL_T1_TEST_CONFIGS:-}; do
    FL_GEMV_T1=$v run_tests "one_token tests FL_GEMV_T1=$v" s11-t1$v 120 "$B/tests/fl-kernels__gemv" one_token --test-threads=2
  done
  run_tests fl-engine__quant_gpu s11-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2 ;;
s11k)
  # lab (session 11, commit 4c3ddfb; reverted: FL_GEMV_T1=4 now selects the 4-warp CTAs of
  # s11w, not this): each tile's k split over a cluster of 2 CTAs: the GEMV tests whole under
  # it, then the quick bench alternated with the default
  FL_GEMV_T1=4 run_tests "fl-kernels__gemv FL_GEMV_T1=4" s11k-gemv 200 "$B/tests/fl-kernels__gemv" --test-threads=2
  for v in 1 4 1 4; do echo "FL_GEMV_T1=$v"
    FL_GEMV_T1=$v quick_bench 1 "int8|int4"
  done ;;
s11w)
  # lab (session 11): CTAs of 4 warps (FL_GEMV_T1=4: cp.async staging; 5, register staging,
  # was removed after this run): the GEMV tests whole under each, the quick bench alternated
  # with the default
  for v in 4 5; do
    FL_GEMV_T1=$v run_tests "fl-kernels__gemv FL_GEMV_T1=$v" s11w-gemv$v 200 "$B/tests/fl-kernels__gemv" --test-threads=2
  done
  for v in 1 4 5 1 4 5; do echo "FL_GEMV_T1=$v"
    FL_GEMV_T1=$v quick_bench 1 "int8|int4"
  done ;;
s11m)
  # memcheck of the one-token kernels' tests (default configuration, then FL_GEMV_T1=3)
  for v in ${FL_T1_MEMCHECK:-1}; do
    FL_GEMV_T1=$v timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/T1=$v /"
  done ;;
s11p)
  # the gemv bench's one-token int8 / int4 lines under each FL_GEMV_T1 configuration
  for v in ${FL_T1_CONFIGS:-1 2 3 4 5 6 0}; do echo "FL_GEMV_T1=$v"
    FL_GEMV_T1=$v quick_bench 1 "int8|int4" > "$OUT/qbench-t1$v.log"
    cat "$OUT/qbench-t1$v.log"
  done ;;
s11s)
  # softmax with ex2.approx.ftz in every path: the softmax tests, then optable's softmax rows
  # (FL_SOFTMAX_REPS runs)
  timeout 150 "$B/tests/fl-kernels__softmax" --test-threads=2 > "$OUT/s11-softmax.log" 2>&1
  echo "fl-kernels__softmax rc=$? $(grep -E '^test result' "$OUT/s11-softmax.log" | tail -1)"
  grep -E "panicked|FAILED|failed" "$OUT/s11-softmax.log" | cut -c1-300 | head -4
  for rep in $(seq 1 ${FL_SOFTMAX_REPS:-2}); do
    timeout 60 "$B/bin/optable" softmax > "$OUT/optable-softmax-$rep.log" 2>&1
    grep -E '"key"' "$OUT/optable-softmax-$rep.log" | sed -E 's/.*"key":"([^"]*)".*"us":([0-9.]+).*"pct_copy":([0-9.]+).*/\1 \2us \3%;/; s/.*"key":"copy".*"gbps":([0-9.]+).*/copy \1GB\/s;/' | tr '\n' ' ' | sed "s/^/rep$rep: /" | cut -c1-2500; echo
  done ;;
s11e)
  # llama-2-7b --quant int4 / int8 decode, FL_GEMV_T1 configurations alternated
  for qv in ${FL_T1_ENGINE:-"int4 1" "int4 0" "int8 1" "int8 0"}; do
    read -r q v <<< "${qv//_/ }"
    echo "$q FL_GEMV_T1=$v $(FL_GEMV_T1=$v decode_line $q)"
  done ;;
s12)
  # session 12: the GGUF one-token GEMV (gemv_t1g_kernel): the GEMV tests whole (default
  # configuration), the GGUF tests under each lab configuration (FL_T1G_TEST_CONFIGS), the
  # engine's quantised tests
  run_tests fl-kernels__gemv s12-gemv 250 "$B/tests/fl-kernels__gemv" --test-threads=2
  for v in ${FL_T1G_TEST_CONFIGS:-2 3}; do
    FL_GEMV_T1G=$v run_tests "gguf tests FL_GEMV_T1G=$v" s12-t1g$v 120 "$B/tests/fl-kernels__gemv" gguf --test-threads=2
  done
  run_tests fl-engine__quant_gpu s12-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2 ;;
s12m)
  # memcheck of the GGUF tests (FL_T1G_MEMCHECK configurations, default 1)
  for v in ${FL_T1G_MEMCHECK:-1}; do
    FL_GEMV_T1G=$v timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" gguf --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/T1G=$v /"
  done ;;
s12p)
  # the gemv bench's one-token Q8_0 / Q4_0 lines under each FL_GEMV_T1G configuration
  for v in ${FL_T1G_CONFIGS:-1 2 3 0}; do echo "FL_GEMV_T1G=$v"
    FL_GEMV_T1G=$v quick_bench gguf "q8_0|q4_0" > "$OUT/qbench-t1g$v.log"
    cat "$OUT/qbench-t1g$v.log"
  done ;;
s12e)
  # llama-2-7b --quant q4_0 / q8_0 decode, FL_GEMV_T1G configurations alternated
  for qv in ${FL_T1G_ENGINE:-"q4_0 1" "q4_0 0" "q8_0 1" "q8_0 0"}; do
    read -r q v <<< "${qv//:/ }"
    echo "$q FL_GEMV_T1G=$v $(FL_GEMV_T1G=$v decode_line $q)"
  done ;;
s12n)
  # ncu of one launch each: the GGUF one-token kernel (Q8_0, Q4_0 at 8195 x 4096, f16; the
  # gguf test's launches 4 and 6 of gemv_t1g_kernel) and the int4 g128 one (8195 x 4224, f16;
  # launch 10 of gemv_t1_kernel in the large int4/int8 test)
  for spec in "gemv_one_token_gguf_kernel gemv_t1g_kernel 4" "gemv_one_token_gguf_kernel gemv_t1g_kernel 6" \
              "gemv_one_token_kernel_on_large gemv_t1_kernel 10"; do
    read -r test kern skip <<< "$spec"
    timeout 200 ncu --kernel-name regex:$kern --launch-skip $skip --launch-count 1 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis "$B/tests/fl-kernels__gemv" $test --test-threads=1 > "$OUT/ncu-$kern-$skip.log" 2>&1
    echo "--- $kern launch $skip rc=$?"
    grep -E "gemv_t1|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Shared Memory Config|Dynamic Shared|Waves Per SM|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|L2 Hit|L1/TEX Hit|Stall|Grid Size" "$OUT/ncu-$kern-$skip.log" | sed -E 's/ +/ /g' | head -40
  done ;;
s15)
  # session 15: the bulk-copy one-token GGUF kernel (gemv_t1b_kernel): the one-token GGUF tests
  # under each FL_GEMV_T1B in FL_T1B_TEST_CONFIGS (memcheck under each FL_T1B_MEMCHECK in the
  # background), then the m = 1 Q8_0 / Q4_0 lines per FL_T1B_CONFIGS
  (for v in ${FL_T1B_MEMCHECK:-1 2 7}; do FL_GEMV_T1B=$v timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token_gguf --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck FL_GEMV_T1B=$v: /"; done > "$OUT/memcheck-t1b.txt") &
  lab_tests FL_GEMV_T1B "${FL_T1B_TEST_CONFIGS:-2 3 4 5 6 7 8 9 10 11 12 13}" one_token_gguf "one-token gguf" s15-t1b
  wait; cat "$OUT/memcheck-t1b.txt"
  lab_runs FL_GEMV_T1B "${FL_T1B_CONFIGS:-1 0 2 6 7 8 9 10 1 0}" qbench-t1b quick_bench gguf "q8_0|q4_0" ;;
s15f)
  # session 15, final code: memcheck of the one-token GGUF test in the background while the
  # GEMV one-token and engine GPU tests run, the m = 1 lines of every format, then llama-2-7b
  # batch-1 decode per FL_S15E (quant:FL_GEMV_T1B)
  (timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token_gguf --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck one_token_gguf: /" > "$OUT/memcheck-s15f.txt") &
  run_tests "gemv one_token" s15f-gemv1 200 "$B/tests/fl-kernels__gemv" one_token --test-threads=2
  run_tests fl-engine__quant_gpu s15f-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
  run_tests fl-engine__engine_gpu s15f-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
  wait; cat "$OUT/memcheck-s15f.txt"
  { quick_bench 1 "int8|int4"; quick_bench gguf "q8_0|q4_0"; } > "$OUT/qbench-final.log"; cat "$OUT/qbench-final.log"
  for qv in ${FL_S15E:-q8_0:1 q8_0:0 q4_0:1 q4_0:0 q8_0:1 q4_0:1}; do
    echo "${qv%%:*} FL_GEMV_T1B=${qv#*:} $(FL_GEMV_T1B=${qv#*:} decode_line ${qv%%:*})"
  done ;;
s16)
  (for v in ${FL_T1T_MEMCHECK:-1 5 7}; do FL_GEMV_T1T=$v timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token_kernel --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck FL_GEMV_T1T=$v: /"; done > "$OUT/memcheck-t1t.txt") &
  run_tests fl-kernels__gemv s16-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
  lab_tests FL_GEMV_T1T "${FL_T1T_TEST_CONFIGS:-0 2 3 4 5 6 7 8}" one_token_kernel "one-token int" s16-t1t
  lab_tests FL_GEMV_T1B "0" one_token_gguf "one-token gguf" s16-t1b
  run_tests fl-engine__quant_gpu s16-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
  run_tests fl-engine__engine_gpu s16-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
  wait; cat "$OUT/memcheck-t1t.txt" ;;
s16p)
  lab_runs FL_GEMV_T1T "${FL_T1T_CONFIGS:-1 0 2 3 4 5 6 7 8 1 0}" qbench-t1t quick_bench 1 "int8|int4"
  lab_runs FL_GEMV_T1B "${FL_T1B_CONFIGS:-1 0 1}" qbench-t1b quick_bench gguf "q8_0|q4_0" ;;
s16f)
  (timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token_kernel --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck one_token_kernel: /" > "$OUT/memcheck-s16f.txt") &
  {
    run_tests fl-kernels__gemv s16f-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
    lab_tests FL_GEMV_T1T "0 2 3 4" one_token_kernel "one-token int" s16f-t1t
    for i in 1 2 3; do
      ( export FL_GEMV_T1T=5; run_tests "one-token int FL_GEMV_T1T=5 run $i" s16f-t1t5-$i 150 "$B/tests/fl-kernels__gemv" one_token_kernel --test-threads=2 )
      grep -hA2 "panicked" "$OUT/s16f-t1t5-$i.log" | cut -c1-400 | head -6
    done
    run_tests fl-engine__quant_gpu s16f-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
    run_tests fl-engine__engine_gpu s16f-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
    wait; cat "$OUT/memcheck-s16f.txt"
  } 2>&1 | tee "$OUT/a-summary.txt"
  lab_runs FL_GEMV_T1T "1 0 1 0" qbench-t1t quick_bench 1 "int8|int4" ;;
s16t)
  for v in 1 3 4 5 0; do
    ( export FL_GEMV_T1T=$v; run_tests "several host threads FL_GEMV_T1T=$v" s16t-$v 150 "$B/tests/fl-kernels__gemv" several_host_threads --test-threads=1 )
  done ;;
s16w)
  # int4 / int8 one-token lab: more warps per SM for t1 (FL_GEMV_T1 7: 4 tiles, ring 4, 8 warps;
  # 8: 4 tiles, ring 6, 4 warps; 9: 4 tiles, ring 3, 8 warps), tests then the m = 1 lines
  lab_tests FL_GEMV_T1 "7 8 9" one_token_kernel "one-token int" s16w-t1
  lab_runs FL_GEMV_T1 "${FL_T1_CONFIGS:-1 7 8 9 1 7 8 9}" qbench-t1 quick_bench 1 "int4" ;;
s16v)
  # the final int4 rule (FL_GEMV_T1=1 against lab 5, the 4-warp CTAs of 4 tiles): memcheck of the
  # one-token int tests, the GEMV tests whole, the m = 1 int lines, llama-2-7b int4 decode
  (timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token_kernel --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck one_token_kernel: /" > "$OUT/memcheck-s16v.txt") &
  run_tests fl-kernels__gemv s16v-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
  run_tests fl-engine__quant_gpu s16v-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
  wait; cat "$OUT/memcheck-s16v.txt"
  lab_runs FL_GEMV_T1 "1 5 1 5" qbench-v quick_bench 1 "int8|int4"
  for v in 1 5 1 5; do echo "int4 FL_GEMV_T1=$v $(FL_GEMV_T1=$v decode_line int4)"; done ;;
s16z)
  # the int4-with-zero-point rule: the one-token int tests, the m = 1 int4 lines twice
  run_tests "gemv one_token" s16z-gemv 200 "$B/tests/fl-kernels__gemv" one_token --test-threads=2
  lab_runs FL_GEMV_T1 "1 1" qbench-z quick_bench 1 "int4" ;;
s16r)
  # the review pass (shared epilogue, device_attr, rows_map, with_index): the GEMV and engine
  # tests, memcheck of the one-token tests, one m = 1 line set per format family
  (timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck one_token: /" > "$OUT/memcheck-s16r.txt") &
  run_tests fl-kernels__gemv s16r-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
  run_tests fl-engine__quant_gpu s16r-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
  run_tests fl-engine__engine_gpu s16r-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
  wait; cat "$OUT/memcheck-s16r.txt"
  quick_bench 1 "int8|int4_g128"; quick_bench gguf "q8_0|q4_0" ;;
s17)
  # session 17: int4's product in the one-token kernel (FL_GEMV_T1_INT4 0 / 2 / 3): memcheck of
  # mode M = FL_S17_MODE (default 3) in the background; the GEMV tests whole under M, the
  # one-token int tests under M with each of t1's int4 kernels forced (FL_GEMV_T1 4 / 5 / 7),
  # the engine's quantised tests under M; then the m = 1 int4 lines per mode in FL_S17_MODES,
  # and llama-2-7b int4 decode per mode in FL_S17_DECODE
  M=${FL_S17_MODE:-3}
  (FL_GEMV_T1_INT4=$M timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token_kernel --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck FL_GEMV_T1_INT4=$M: /" > "$OUT/memcheck-s17.txt") &
  {
    ( export FL_GEMV_T1_INT4=$M; run_tests "gemv FL_GEMV_T1_INT4=$M" s17-gemv$M 300 "$B/tests/fl-kernels__gemv" --test-threads=2 )
    ( export FL_GEMV_T1_INT4=$M; lab_tests FL_GEMV_T1 "4 5 7" one_token_kernel "one-token int, mode $M," s17-t1m$M- )
    ( export FL_GEMV_T1_INT4=$M; run_tests "quant_gpu FL_GEMV_T1_INT4=$M" s17-quant$M 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2 )
    wait; cat "$OUT/memcheck-s17.txt"
  } 2>&1 | tee "$OUT/a-summary.txt"
  lab_runs FL_GEMV_T1_INT4 "${FL_S17_MODES:-0 3 0 3}" qbench-m quick_bench 1 "int4"
  for v in ${FL_S17_DECODE:-0 3 0 3}; do echo "int4 FL_GEMV_T1_INT4=$v $(FL_GEMV_T1_INT4=$v decode_line int4)"; done ;;
s17n)
  # ncu of one launch of the one-token int4 kernel per FL_GEMV_T1_INT4 mode and shape (optable
  # keys; FL_S17N_KEYS, FL_S17N_MODES): time, issue, stalls per issued instruction, instructions
  for key in ${FL_S17N_KEYS:-"gemv_int4_g128|f16|1x4096x11008" "gemv_int4_g128|f16|1x11008x4096"}; do
    for v in ${FL_S17N_MODES:-0 2}; do
      tag=$(echo "$key" | tr '|' '_')-m$v
      FL_GEMV_T1_INT4=$v timeout 200 ncu --kernel-name regex:gemv_t1_kernel --launch-skip 3 --launch-count 1 --section SpeedOfLight \
        --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats --section InstructionStats \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor.sum" \
        "$B/bin/optable" "$key" > "$OUT/ncu-$tag.log" 2>&1
      echo "--- $key mode $v rc=$?"
      grep -E "Duration|DRAM Throughput|Registers Per|Dynamic Shared|Warp Cycles Per Issued|Issued Warp Per|Active Warps Per|Eligible Warps|Executed Instructions |inst_executed" "$OUT/ncu-$tag.log" | sed -E 's/ +/ /g' | head -14
      grep -E "issue_stalled" "$OUT/ncu-$tag.log" | sed -E 's/ +/ /g; s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | awk '$NF+0 >= 0.1' | head -10
    done
  done ;;
s17f)
  # session 17, final code: memcheck of the one-token tests in the background; the GEMV tests
  # whole, the one-token tests under FL_GEMV_T1_INT4 0 and 2, the engine GPU tests (summary in
  # a-summary.txt); the m = 1 int4 lines with FL_GEMV_T1_INT4 1 / 0 twice and once with t1's
  # 4-warp CTAs forced (FL_GEMV_T1=5); llama-2-7b int4 decode per FL_S17F_DECODE
  (timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck one_token: /" > "$OUT/memcheck-s17f.txt") &
  {
    run_tests fl-kernels__gemv s17f-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
    lab_tests FL_GEMV_T1_INT4 "0 2" one_token "one-token" s17f-m
    run_tests fl-engine__quant_gpu s17f-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
    run_tests fl-engine__engine_gpu s17f-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
    wait; cat "$OUT/memcheck-s17f.txt"
  } 2>&1 | tee "$OUT/a-summary.txt"
  lab_runs FL_GEMV_T1_INT4 "1 0 1 0" qbench-f quick_bench 1 "int4"
  echo "FL_GEMV_T1=5"; FL_GEMV_T1=5 quick_bench 1 "int4"
  for v in ${FL_S17F_DECODE:-1 0 1}; do echo "int4 FL_GEMV_T1_INT4=$v $(FL_GEMV_T1_INT4=$v decode_line int4)"; done ;;
s18|s18b|s18f)
  # session 18 (see the header): calls 1 (s18), 2 (s18b), 3 and 5 (s18f)
  case $sec in s18f) mc="one_token multi_token_int";; *) mc=one_token;; esac
  raw_tests() {  # s18 / s18b: the one-token tests per FL_GEMV_T1G_RAW (commit a0d37f5's option)
    for v in ${FL_S18_RAW_TESTS:-}; do run_tests "one-token FL_GEMV_T1G_RAW=$v" s18-raw$v 200 env FL_GEMV_T1G_RAW=$v "$B/tests/fl-kernels__gemv" one_token --test-threads=2; done
  }
  gemv_suite "$mc" $sec raw_tests
  case $sec in
  s18)
    for v in ${FL_S18_RAW:-1}; do echo "FL_GEMV_T1G_RAW=$v"; FL_GEMV_T1G_RAW=$v quick_bench q4 "int4|q4_0"; done
    for v in ${FL_S18_T1:-}; do echo "FL_GEMV_T1=$v"; FL_GEMV_T1=$v quick_bench 1 "int4"; done ;;
  s18b)
    ab_m1 "${FL_S18_AB:-2}"
    for v in ${FL_S18_RAW:-1 0 1 0}; do echo "FL_GEMV_T1G_RAW=$v"; FL_GEMV_T1G_RAW=$v quick_bench gguf "q4_0"; done ;;
  s18f)
    ab_m1 "${FL_S18_AB:-2}"
    for bb in "$FL_S18_A" "$B"; do echo "bundle $bb m=${FL_S18_M:-4,16}"; B="$bb" m_bench 1 "int4" "${FL_S18_M:-4,16}"; B="$bb" m_bench q4 "int4" "${FL_S18_M:-4,16}"; done
    echo "final table"; quick_bench 1 "int8|int4"; quick_bench gguf "q8_0|q4_0" ;;
  esac
  if [ $sec = s18f ]; then for q in int4 q4_0; do echo "$q $(decode_line $q)"; done
  else for v in ${FL_S18_DECODE:-}; do echo "q4_0 FL_GEMV_T1G_RAW=$v $(FL_GEMV_T1G_RAW=$v decode_line q4_0)"; done; fi ;;
s20)
  # session 20: the one-token GEMVs (t1, t1t, t1g, t1b) as programmatic dependent launches
  # (FL_GEMV_PDL=1, in the builds of calls 1-2 and 6; since removed, so the variable no longer
  # exists) against plain launches (0). The GEMV tests whole per value in
  # FL_S20_TESTS (default 1), memcheck of the chain test under PDL (FL_S20_MC), the engine's
  # quantised tests per value in FL_S20_QTESTS (default 1), with FL_S20_FINAL the engine GPU
  # tests; then llama-2-7b batch-1 decode per quantisation in FL_S20_DECODE (default "int4
  # q4_0") with FL_GEMV_PDL = FL_S20_DV (default 0 1 0 1), and the one-token bench lines of
  # every format per value, alternated FL_S20_AB times (default 1).
  {
    for v in ${FL_S20_TESTS:-1}; do run_tests "gemv FL_GEMV_PDL=$v" s20-gemv$v 300 env FL_GEMV_PDL=$v "$B/tests/fl-kernels__gemv" --test-threads=2; done
    [ -n "${FL_S20_MC:-}" ] && echo "memcheck chain PDL=1: $(FL_GEMV_PDL=1 timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" chain --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | tr '\n' ' ')"
    for v in ${FL_S20_QTESTS:-1}; do run_tests "quant_gpu FL_GEMV_PDL=$v" s20-quant$v 200 env FL_GEMV_PDL=$v "$B/tests/fl-engine__quant_gpu" --test-threads=2; done
    [ -n "${FL_S20_FINAL:-}" ] && run_tests fl-engine__engine_gpu s20-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
  } 2>&1 | tee "$OUT/a-summary.txt"
  for q in ${FL_S20_DECODE:-int4 q4_0}; do
    for v in ${FL_S20_DV:-0 1 0 1}; do echo "$q PDL=$v $(FL_GEMV_PDL=$v decode_line $q)"; done
  done
  for r in $(seq ${FL_S20_AB:-1}); do
    for v in 0 1; do echo "PDL=$v"; FL_GEMV_PDL=$v quick_bench 1 "int8|int4"; FL_GEMV_PDL=$v quick_bench gguf "q8_0|q4_0"; done
  done ;;
s20b)
  # session 20, bf16 activations: the chain test, the one-token bench lines of every format in
  # f16 and bf16 (FL_GEMV_BENCH_DTYPE=both), llama-2-7b batch-1 decode in bf16 per
  # quantisation in FL_S20_BF16 (default "int4 q4_0")
  run_tests "gemv chain" s20b-chain 200 "$B/tests/fl-kernels__gemv" chain --test-threads=2 | tee "$OUT/a-summary.txt"
  FL_GEMV_BENCH_DTYPE=both quick_bench 1 "int8|int4"; FL_GEMV_BENCH_DTYPE=both quick_bench gguf "q8_0|q4_0"
  for q in ${FL_S20_BF16:-int4 q4_0}; do
    echo "$q bf16 $(timeout 100 "$B/bin/fl" bench --model llama-2-7b --dtype bf16 --quant "$q" --runs 1:128:64 2>&1 | grep -E "decode:|rror" | awk '{printf "%s | ", $0}')"
  done ;;
s21g)
  # session 21, after call 4: gemv_multi_token_int_kernel with the seed that failed there
  # (FL_S21_SEED), in this build (per-token check floored at the tokens' RMS) and in the previous
  # one ($B/base/fl-kernels__gemv, the check relative to each token alone); then the GEMV tests
  # whole with a fresh seed
  sd=${FL_S21_SEED:-1795599915738307379}
  run_tests "tmi seed $sd, this build" s21g-new 200 env FL_TEST_SEED=$sd "$B/tests/fl-kernels__gemv" gemv_multi_token_int_kernel
  run_tests "tmi seed $sd, previous build" s21g-old 200 env FL_TEST_SEED=$sd "$B/base/fl-kernels__gemv" gemv_multi_token_int_kernel
  run_tests fl-kernels__gemv s21g-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2 ;;
s21f)
  # session 21's final check (t1 / t1g weight copies with the L2 prefetch hint): the GEMV tests
  # whole, memcheck of the one-token int4 (MODE 2) and GGUF tests, the engine's quantised and
  # GPU tests
  {
    run_tests fl-kernels__gemv s21f-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
    echo "memcheck t1 / t1g: $(timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token_int4_raw_pairs one_token_gguf_kernel --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | tr '\n' ' ')"
    run_tests fl-engine__quant_gpu s21f-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
    run_tests fl-engine__engine_gpu s21f-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
  } 2>&1 | tee "$OUT/a-summary.txt" ;;
s21t)
  # session 21's final table (f16, m = 1, every format) and llama-2-7b int4 / q4_0 batch-1 decode
  echo "final table"; quick_bench 1 "int8|int4"; quick_bench gguf "q8_0|q4_0"
  for q in int4 q4_0; do echo "decode $q: $(decode_line $q)"; done ;;
s21c)
  # session 21, call 3: an L2 prefetch-size hint on the one-token rings' cp.async weight copies
  # (t1, t1g; FL_GEMV_L2PF = 0 / 128 / 256, lab, since removed: t1 takes 256, t1g 128, and the
  # variable no longer exists): two one-token tests under 256 (the hint is
  # only a hint: they guard the PTX), then the m = 1 int4 and GGUF lines per value, alternated
  # FL_S21_AB times (default 2)
  for v in 128 256; do
    run_tests "t1 / t1g tests FL_GEMV_L2PF=$v" s21c-$v 200 env FL_GEMV_L2PF=$v "$B/tests/fl-kernels__gemv" one_token_int4_raw_pairs one_token_gguf_kernel --test-threads=2
  done
  for r in $(seq ${FL_S21_AB:-2}); do
    for v in 0 128 256; do
      echo "FL_GEMV_L2PF=$v"; FL_GEMV_L2PF=$v quick_bench 1 "int4"; FL_GEMV_L2PF=$v quick_bench gguf "q4_0|q8_0"
    done
  done ;;
s21b)
  # session 21, call 2: the one-token int kernel's instruction diet (group >= 128: two scale
  # loads per tile, not four; ring copies without predicates inside k) and the lab variants
  # FL_GEMV_T1=8 (int4: 16-warp CTAs of 4 tiles, ring 3) / 9 (8-warp CTAs of 4 tiles, ring 3,
  # 3 CTAs per SM by register cap; call 2's build only, both removed with the diet): the GEMV tests whole, the one-token tests under 8 and 9,
  # memcheck of the int one-token tests; then the m = 1 int lines of the previous build
  # ($B/base/gemv) and of this one per value, alternated FL_S21_AB times (default 2)
  [ -z "${FL_S21_NO_TESTS:-}" ] && {
    run_tests fl-kernels__gemv s21b-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
    for v in 8 9; do
      run_tests "one_token FL_GEMV_T1=$v" s21b-t1-$v 200 env FL_GEMV_T1=$v "$B/tests/fl-kernels__gemv" one_token --test-threads=2
    done
    echo "memcheck int one-token: $(timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token_int4_raw_pairs --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | tr '\n' ' ')"
  } 2>&1 | tee "$OUT/a-summary.txt"
  for r in $(seq ${FL_S21_AB:-2}); do
    echo "base (previous build)"; FL_GEMV_BIN=$B/base/gemv quick_bench 1 "int4|int8"
    for v in 1 8 9; do echo "FL_GEMV_T1=$v"; FL_GEMV_T1=$v quick_bench 1 "int4"; done
  done ;;
s21a)
  # session 21, call 1: the read-only floor (bench/gpu/read_floor.cu, built as $B/bin/read_floor)
  # at the one-token weight sizes; the int4 one-token lines (f16); ncu of the int4 one-token
  # kernels at the issue's three smaller shapes
  "$B/bin/read_floor" | tee "$OUT/read_floor.log"
  quick_bench 1 "int4"
  FL_NCU_KEYS="${FL_NCU_KEYS:-gemv_t1_kernel:gemv_int4_g128|f16|1x11008x4096 gemv_t1_kernel:gemv_int4zp_g128|f16|1x11008x4096 \
    gemv_t1_kernel:gemv_int4_g128|f16|1x4096x11008 gemv_t1_kernel:gemv_int4zp_g128|f16|1x4096x11008 \
    gemv_t1_kernel:gemv_int4_g128|f16|1x4096x4096}" bash "$0" "$B" "$OUT" s14n ;;
s20f)
  # session 20's final check of the shipped kernels: the GEMV tests whole, memcheck of the bf16
  # test, the engine's quantised and GPU tests, then the final one-token table (f16)
  {
    run_tests fl-kernels__gemv s20f-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
    echo "memcheck bf16_far: $(timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" bf16_far --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | tr '\n' ' ')"
    run_tests fl-engine__quant_gpu s20f-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
    run_tests fl-engine__engine_gpu s20f-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
  } 2>&1 | tee "$OUT/a-summary.txt"
  echo "final table"; quick_bench 1 "int8|int4"; quick_bench gguf "q8_0|q4_0" ;;
s20c)
  # session 20, bf16 on the f16 path in the GGUF one-token kernels (FL_GEMV_BF16_F16=1 in
  # call 5's build; since removed, so the variable no longer exists) against the bf16 path (0): the GEMV tests whole, the GGUF tests under 0, memcheck
  # of the new bf16 test, the engine's quantised tests; then the Q8_0 / Q4_0 one-token lines in
  # bf16 (and f16 once) at the issue's shapes and 22016 x 4096 / 12288 x 4096, per value,
  # alternated FL_S20_AB times (default 2); llama-2-7b bf16 decode per quantisation in
  # FL_S20_BF16 (default "q4_0 q8_0") per value. FL_S20_NO_TESTS skips the tests.
  [ -z "${FL_S20_NO_TESTS:-}" ] && {
    run_tests fl-kernels__gemv s20c-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
    run_tests "gguf FL_GEMV_BF16_F16=0" s20c-gguf0 200 env FL_GEMV_BF16_F16=0 "$B/tests/fl-kernels__gemv" gguf --test-threads=2
    echo "memcheck bf16_far: $(timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" bf16_far --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | tr '\n' ' ')"
    run_tests fl-engine__quant_gpu s20c-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
    [ -n "${FL_S20_FINAL:-}" ] && run_tests fl-engine__engine_gpu s20c-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
  } 2>&1 | tee "$OUT/a-summary.txt"
  for r in $(seq ${FL_S20_AB:-2}); do
    for v in 1 0; do
      echo "FL_GEMV_BF16_F16=$v"
      FL_GEMV_BF16_F16=$v FL_GEMV_BENCH_DTYPE=bf16 quick_bench gguf "q8_0|q4_0"
      FL_GEMV_BF16_F16=$v FL_GEMV_BENCH_DTYPE=bf16 FL_GEMV_BENCH_SHAPES=22016x4096,12288x4096 quick_bench gguf "q8_0|q4_0"
    done
  done
  [ -n "${FL_S20_F16:-}" ] && { echo "f16"; quick_bench gguf "q8_0|q4_0"; }
  for q in ${FL_S20_BF16:-q4_0 q8_0}; do
    for v in 1 0; do
      echo "$q bf16 BF16_F16=$v $(FL_GEMV_BF16_F16=$v timeout 100 "$B/bin/fl" bench --model llama-2-7b --dtype bf16 --quant "$q" --runs 1:128:64 2>&1 | grep -E "decode:|rror" | awk '{printf "%s | ", $0}')"
    done
  done ;;
s19)
  # session 19: t1g lab values against the default (call 1: 8 = x read from global memory;
  # call 2: 8 / 9 = one-slot rings / 8 warps; call 4: 9 = one-slot rings with 2 tiles; all
  # three since removed; call 3 on: 8 = session 18's rule, the one-slot rings being the
  # default). The GEMV tests whole (FL_S19_NO_GEMV skips them), the GGUF tests per lab value in
  # FL_S19_TESTS with and without the copy-engine kernel (T1B=0 sends every Q8_0 / Q4_0
  # one-token call to t1g) and memcheck of them, the engine's quantised tests; then the Q8_0 /
  # Q4_0 one-token lines per value in FL_S19_T1G, alternated FL_S19_AB times (FL_S19_NO_B0
  # drops their T1B=0 lines), the Q4_0 lines per value in FL_S19_B0_T1G under T1B=0 beside
  # the default's, FL_S19_B0_AB times; q4_0 decode per FL_S19_DECODE. FL_S19_FINAL adds the
  # engine GPU tests, memcheck of the default and the final table.
  gguf_memcheck() { timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" one_token_gguf --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | tr '\n' ' '; }
  {
    [ -z "${FL_S19_NO_GEMV:-}" ] && run_tests fl-kernels__gemv s19-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
    for v in ${FL_S19_TESTS:-8}; do
      run_tests "gguf FL_GEMV_T1G=$v" s19-t1g$v 200 env FL_GEMV_T1G=$v "$B/tests/fl-kernels__gemv" gguf --test-threads=2
      run_tests "gguf FL_GEMV_T1G=$v T1B=0" s19-t1g$v-b0 200 env FL_GEMV_T1B=0 FL_GEMV_T1G=$v "$B/tests/fl-kernels__gemv" gguf --test-threads=2
      echo "memcheck T1G=$v T1B=0: $(FL_GEMV_T1B=0 FL_GEMV_T1G=$v gguf_memcheck)"
    done
    run_tests fl-engine__quant_gpu s19-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
    [ -n "${FL_S19_FINAL:-}" ] && run_tests fl-engine__engine_gpu s19-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
    [ -n "${FL_S19_FINAL:-}" ] && echo "memcheck default: $(gguf_memcheck)"
  } 2>&1 | tee "$OUT/a-summary.txt"
  for r in $(seq ${FL_S19_AB:-2}); do
    for v in ${FL_S19_T1G:-1 8}; do
      echo "T1G=$v"; FL_GEMV_T1G=$v quick_bench gguf "q4_0|q8_0"
      [ -z "${FL_S19_NO_B0:-}" ] && { echo "T1G=$v T1B=0"; FL_GEMV_T1B=0 FL_GEMV_T1G=$v quick_bench gguf "q4_0|q8_0"; }
    done
  done
  for r in $(seq ${FL_S19_B0_AB:-0}); do
    for v in ${FL_S19_B0_T1G:-1 8}; do echo "T1G=$v T1B=0"; FL_GEMV_T1B=0 FL_GEMV_T1G=$v quick_bench gguf "q4_0"; done
    echo "default"; quick_bench gguf "q4_0"
  done
  [ -n "${FL_S19_FINAL:-}" ] && { echo "final table"; quick_bench 1 "int8|int4"; quick_bench gguf "q8_0|q4_0"; }
  for v in ${FL_S19_DECODE:-1 8 1 8}; do echo "q4_0 T1G=$v $(FL_GEMV_T1G=$v decode_line q4_0)"; done ;;
s18g)
  {
    run_tests fl-kernels__gemv s18g-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
    for v in ${FL_T1G_TEST_CONFIGS:-}; do run_tests "one-token gguf FL_GEMV_T1G=$v" s18g-t1g$v 200 env FL_GEMV_T1G=$v "$B/tests/fl-kernels__gemv" one_token_gguf --test-threads=2; done
  } 2>&1 | tee "$OUT/a-summary.txt"
  quick_bench 1 "int4"; quick_bench q4 "int4|q4_0"
  for v in ${FL_T1G_CONFIGS:-}; do echo "FL_GEMV_T1G=$v"; FL_GEMV_T1G=$v quick_bench gguf "q4_0"; done
  for r in $(seq ${FL_S18_RUNS:-2}); do echo "int4 $(decode_line int4)"; done
  echo "q4_0 $(decode_line q4_0)"
  if [ -n "${FL_S18_A:-}" ]; then
    for r in 1 2; do
      for bb in "$FL_S18_A" "$B"; do echo "bundle $bb m=${FL_S18_M:-16}"; B="$bb" m_bench 1 "int4" "${FL_S18_M:-16}"; done
    done
  fi ;;
s16e)
  for v in 1 0 1 0; do echo "int8 FL_GEMV_T1T=$v $(FL_GEMV_T1T=$v decode_line int8)"; done ;;
s14)
  # session 14: the GEMV tests whole, then the lab variants of this session: warp pairs per
  # ring in the multi-token int kernel (FL_GEMV_TMI=5 / 6), 6-tile CTAs in the one-token int
  # kernel (FL_GEMV_T1=6), 6- / 8-tile CTAs in the one-token GGUF kernel (FL_GEMV_T1G=5 / 6)
  run_tests fl-kernels__gemv s14-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
  lab_tests FL_GEMV_TMI "${FL_TMI_TEST_CONFIGS:-5 6}" multi_token_int "multi-token int" s14-tmi
  lab_tests FL_GEMV_T1 "${FL_T1_TEST_CONFIGS:-6}" one_token_kernel "one-token int" s14-t1
  lab_tests FL_GEMV_T1G "${FL_T1G_TEST_CONFIGS:-5 6}" one_token_gguf "one-token gguf" s14-t1g ;;
s14b)
  # one-token A/B: FL_GEMV_T1 configurations (int8 / int4), then FL_GEMV_T1G (Q8_0 / Q4_0)
  lab_runs FL_GEMV_T1 "${FL_T1_CONFIGS:-1 6}" s14b-qbench-t1 quick_bench 1 "int8|int4"
  lab_runs FL_GEMV_T1G "${FL_T1G_CONFIGS:-1 5 6}" s14b-qbench-t1g quick_bench gguf "q8_0|q4_0" ;;
s14n)
  # ncu of one launch of each one-token kernel (optable keys FL_NCU_KEYS), launch 3 of the key's
  # (past the warm-up), stall reasons per issued instruction
  for spec in ${FL_NCU_KEYS:-"gemv_t1g_kernel:gemv_q8_0|f16|1x11008x4096" "gemv_t1g_kernel:gemv_q4_0|f16|1x11008x4096" \
              "gemv_t1_kernel:gemv_int4_g128|f16|1x11008x4096" "gemv_t1_kernel:gemv_int8|f16|1x11008x4096" \
              "gemv_t1g_kernel:gemv_q4_0|f16|1x4096x4096"}; do
    kern=${spec%%:*}; key=${spec#*:}; tag=$(echo "$key" | tr '|' '_')
    timeout 200 ncu --kernel-name regex:$kern --launch-skip 3 --launch-count 1 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      "$B/bin/optable" "$key" > "$OUT/ncu-$tag.log" 2>&1
    echo "--- $key rc=$?"
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Block Limit (Sh|Reg|Wa)|Registers Per|Dynamic Shared|Waves Per SM|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|L2 Hit|Grid Size" "$OUT/ncu-$tag.log" | sed -E 's/ +/ /g' | head -24
    grep -E "issue_stalled" "$OUT/ncu-$tag.log" | sed -E 's/ +/ /g; s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | awk '$NF+0 >= 0.05' | head -14
  done ;;
s14c)
  # session 14, pairs of warps per ring in the GGUF kernels: tests (FL_TMG_TEST_CONFIGS for the
  # multi-token GGUF test, FL_T1G_TEST_CONFIGS for the one-token one), then the GGUF lines at
  # m = 1 per FL_T1G_CONFIGS and at FL_TMG_M tokens per FL_TMG_CONFIGS (repeats allowed)
  run_tests fl-kernels__gemv s14c-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
  lab_tests FL_GEMV_TMG "${FL_TMG_TEST_CONFIGS:-5 6}" multi_token_gguf "multi-token gguf" s14c-tmg
  lab_tests FL_GEMV_T1G "${FL_T1G_TEST_CONFIGS:-7}" one_token_gguf "one-token gguf" s14c-t1g
  lab_runs FL_GEMV_T1G "${FL_T1G_CONFIGS:-1 7 1 7}" qbench-t1g quick_bench gguf "q8_0|q4_0"
  lab_runs FL_GEMV_TMG "${FL_TMG_CONFIGS:-1 6}" mbench-tmg m_bench gguf "q8_0|q4_0" "${FL_TMG_M:-4,16}" ;;
s14f)
  # session 14, final code: memcheck of both multi-token tests in the background while the
  # GEMV and engine tests run, then the gemv bench at FL_TMG_M tokens, every format
  for f in multi_token_gguf multi_token_int; do
    (timeout 400 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" $f --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck $f: /" > "$OUT/memcheck-$f.txt") &
  done
  run_tests fl-kernels__gemv s14f-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
  run_tests fl-engine__quant_gpu s14f-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2
  run_tests fl-engine__engine_gpu s14f-engine 200 "$B/tests/fl-engine__engine_gpu" --test-threads=2
  wait; cat "$OUT"/memcheck-*.txt
  m_bench 0 "int8|int4|q8_0|q4_0" "${FL_TMG_M:-4,16}" > "$OUT/mbench-final.log"; cat "$OUT/mbench-final.log" ;;
s14e)
  # llama-2-7b batch-16 decode per quant (FL_S14E: quant:TMG:TMI triples)
  for qv in ${FL_S14E:-q4_0:1:1 q4_0:7:6 q8_0:1:1 q8_0:7:6 int4:1:1 int4:1:6 int8:1:1}; do
    IFS=: read -r q vg vi <<< "$qv"
    echo "$q FL_GEMV_TMG=$vg FL_GEMV_TMI=$vi $(FL_GEMV_TMG=$vg FL_GEMV_TMI=$vi decode16_line $q)"
  done ;;
s13)
  # session 13: the GGUF GEMV for 2..16 tokens: the GEMV tests whole (default configuration),
  # the multi-token GGUF test under each lab configuration, the engine's quantised tests
  run_tests fl-kernels__gemv s13-gemv 300 "$B/tests/fl-kernels__gemv" --test-threads=2
  for v in ${FL_TMG_TEST_CONFIGS:-2 3 4 5}; do
    FL_GEMV_TMG=$v run_tests "multi-token gguf FL_GEMV_TMG=$v" s13-tmg$v 120 "$B/tests/fl-kernels__gemv" multi_token_gguf --test-threads=2
  done
  for v in ${FL_TMI_TEST_CONFIGS:-2 3 4}; do
    FL_GEMV_TMI=$v run_tests "multi-token int FL_GEMV_TMI=$v" s13-tmi$v 150 "$B/tests/fl-kernels__gemv" multi_token_int --test-threads=2
  done
  run_tests fl-engine__quant_gpu s13-quant 200 "$B/tests/fl-engine__quant_gpu" --test-threads=2 ;;
s13m)
  for f in ${FL_TMG_MEMCHECK:-multi_token_gguf multi_token_int}; do
    timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" $f --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck $f: /"
  done ;;
s13i)
  # the gemv bench's int8 / int4 lines at FL_TMG_M tokens under each FL_GEMV_TMI configuration
  for v in ${FL_TMI_CONFIGS:-1 0 2 3 4}; do echo "FL_GEMV_TMI=$v"
    FL_GEMV_TMI=$v m_bench 1 "int8|int4" "${FL_TMG_M:-4,16}" > "$OUT/mbench-tmi$v.log"
    cat "$OUT/mbench-tmi$v.log"
  done ;;
s13p)
  # the gemv bench's Q8_0 / Q4_0 lines at FL_TMG_M tokens under each FL_GEMV_TMG configuration
  for v in ${FL_TMG_CONFIGS:-1 2 3 4 5 0}; do echo "FL_GEMV_TMG=$v"
    FL_GEMV_TMG=$v m_bench gguf "q8_0|q4_0" "${FL_TMG_M:-4,16}" > "$OUT/mbench-tmg$v.log"
    cat "$OUT/mbench-tmg$v.log"
  done ;;
s13e)
  # llama-2-7b --quant q4_0 / q8_0 decode at batch 16, FL_GEMV_TMG configurations alternated
  for qv in ${FL_TMG_ENGINE:-"q4_0 1" "q4_0 0" "q8_0 1" "q8_0 0"}; do
    read -r q v <<< "${qv//:/ }"
    echo "$q FL_GEMV_TMG=$v $(FL_GEMV_TMG=$v decode16_line $q)"
  done
  for qv in ${FL_TMI_ENGINE:-}; do
    read -r q v <<< "${qv//:/ }"
    echo "$q FL_GEMV_TMI=$v $(FL_GEMV_TMI=$v decode16_line $q)"
  done ;;
s12f)
  # session 12, the final code: the GEMV tests whole, the GGUF tests under the lab
  # configurations, the engine's quantised tests, memcheck of the one-token tests (both
  # kernels), the quick benches (int8 / int4 twice, GGUF on and off), the whole gemv bench's
  # summary lines, llama-2-7b decode with each weight-only format
  FL_T1G_TEST_CONFIGS="${FL_T1G_TEST_CONFIGS:-2 3}" bash "$0" "$B" "$OUT" s12
  for f in one_token gguf; do
    timeout 250 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__gemv" $f --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 | sed "s/^/memcheck $f: /"
  done
  for v in 1 1; do echo "quick int8/int4 (FL_GEMV_T1=$v)"
    FL_GEMV_T1=$v quick_bench 1 "int8|int4"
  done
  FL_T1G_CONFIGS="1 0" bash "$0" "$B" "$OUT" s12p
  timeout 200 "$B/benches/gemv" --bench no_criterion_match 2>&1 | grep -E "^gemv [0-9]+x[0-9]+ m=" | shorten | tee "$OUT/qbench.log"
  for q in int4 int8 q4_0 q8_0; do echo "$q $(decode_line $q)"; done ;;
qbench)
  # the gemv bench's own timing lines (criterion's runs filtered out; each line is timed after
  # untimed warm-up launches), about 40 s
  timeout 150 "$B/benches/gemv" --bench no_criterion_match 2>&1 | grep -E "^gemv [0-9]+x[0-9]+ m=" | tee "$OUT/qbench.log" ;;
warpsweep)
  # batch-1 decode under dense-GEMV warp / tile overrides (8 warps everywhere was +0.3 points
  # in session 6); about 20 s per row
  for e in "X=0" "FL_GEMV_DENSE_WARPS=8" "FL_GEMV_DENSE_WARPS=16" "FL_GEMV_DENSE_NT=1" \
           "FL_GEMV_DENSE_WARPS=8 FL_GEMV_DENSE_NT=1" "FL_GEMV_DENSE_WARPS=16 FL_GEMV_DENSE_NT=1" "X=0"; do
    r=$(env $e timeout 100 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128 2>&1 | grep -E "decode:|rror" | awk '{printf "%s | ", $0}')
    echo "b1 $e $r"; done ;;
tests)
  pass=0; fail=0
  for t in "$B"/tests/*; do
    n=$(basename "$t"); timeout 200 "$t" --test-threads=2 > "$OUT/test-$n.log" 2>&1; rc=$?
    r=$(grep -E '^test result' "$OUT/test-$n.log" | awk '{p+=$4; f+=$6} END {print p+0, f+0}')
    pass=$((pass + ${r% *})); fail=$((fail + ${r#* }))
    [ $rc != 0 ] && { echo "$n rc=$rc"; grep -E "panicked|FAILED|failed" "$OUT/test-$n.log" | head -6; }
  done
  echo "TESTS: $pass passed, $fail failed"
  # the softmax paths again under each cluster-grid setting (read once per process)
  for g in rows resident 7; do
    FL_SOFTMAX_CLUSTER_GRID=$g timeout 200 "$B/tests/fl-kernels__softmax" --test-threads=2 > "$OUT/test-softmax-$g.log" 2>&1
    echo "softmax tests FL_SOFTMAX_CLUSTER_GRID=$g rc=$? $(grep -E '^test result' "$OUT/test-softmax-$g.log" | tail -1)"
  done ;;
bench1)
  timeout 250 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128,16:1024:64,64:1024:64,16:4032:64,1:4032:64,1:2048:2,16:512:2 2>&1 | grep -E "^batch|decode:|prefill:" | tee "$OUT/fl-bench.log" ;;
check)
  timeout 400 python3 "$B/scripts/check_transformers.py" --fl "$B/bin/fl" --workdir /tmp/flcheck > "$OUT/check.log" 2>&1
  echo "check rc=$?"; grep -E "PASS|FAIL" "$OUT/check.log" | tail -8 ;;
ops)
  for op in ${FL_OPS:-softmax embedding}; do echo "== $op"
    timeout 200 python3 "$B/scripts/compare.py" "$B/bin/optable" "$op" 2>&1 | grep -vE "Warning|warn" | tail -20; done ;;
kbench)
  for b in ${FL_KBENCH:-gemv gemv_dense}; do
    timeout 200 "$B/benches/$b" --bench --warm-up-time 0.1 --measurement-time 0.2 2>&1 | grep -E "^$b|time:" | paste - - | cut -c1-200; done ;;
rope)
  for f in 1 0 1 0; do
    r=$(FL_FUSE_ROPE=$f timeout 120 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128,1:4032:64,4:512:64 2>&1 | grep -E "decode:|rror" | awk '{printf "%s | ", $0}')
    echo "FL_FUSE_ROPE=$f $r"
  done
  r=$(FL_GEMV_DENSE_WARPS=8 timeout 120 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128 2>&1 | grep -E "decode:|rror" | awk '{printf "%s | ", $0}')
  echo "FL_FUSE_ROPE=1 FL_GEMV_DENSE_WARPS=8 $r" ;;
splitsweep)
  for e in "X=0" "FL_ATTN_SPLIT_KEYS=64" "FL_ATTN_SPLIT_KEYS=32" "FL_GEMV_DENSE_WARPS=8" \
           "FL_GEMV_DENSE_WARPS=8 FL_ATTN_SPLIT_KEYS=64" "FL_ATTN_SPLIT_KEYS=128" "X=0"; do
    r=$(env $e timeout 100 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128,1:4032:64,4:512:64 2>&1 | grep -E "decode:|rror" | sed -E 's/ms\/step.*= ([0-9.]+)% of the bandwidth floor/ms \1%/' | awk '{printf "%s | ", $0}')
    echo "$e $r"; done ;;
dbench)
  timeout 200 "$B/benches/gemv_dense" --bench no_criterion_match 2>&1 | grep -E "^gemv_dense [0-9]+x" | tee "$OUT/dbench.log" ;;
normab)
  for e in "X=0" "FL_GEMV_NORM=0" "X=0" "FL_GEMV_NORM=0"; do
    r=$(env $e timeout 100 "$B/bin/fl" bench --model llama-2-7b --runs 1:128:128,1:4032:64 2>&1 | grep -E "decode:|rror" | sed -E 's/ms\/step.*= ([0-9.]+)% of the bandwidth floor/ms \1%/' | awk '{printf "%s | ", $0}')
    echo "$e $r"; done
  FL_ATTN_SPLIT_KEYS=16 timeout 200 "$B/tests/fl-kernels__attention" --test-threads=2 > "$OUT/attn16.log" 2>&1
  echo "attention tests FL_ATTN_SPLIT_KEYS=16 rc=$? $(grep -E '^test result' "$OUT/attn16.log" | tail -1)" ;;
torchgen)
  timeout ${FL_TORCHGEN_S:-560} python3 -u "$B/scripts/torch_generate.py" --runs 1:128:128,16:1024:64,64:1024:64,1:2048:2,16:512:2 --modes eager,compile 2>&1 | grep --line-buffered -vE "Warning|warn" | tee "$OUT/torchgen.log" ;;
subtests)
  t0=$(date +%s)
  for n in $FL_TESTS; do
    [ $(( $(date +%s) - t0 )) -gt ${FL_TEST_BUDGET:-240} ] && { echo "$n: not run (budget)"; continue; }
    timeout 120 "$B/tests/$n" --test-threads=2 > "$OUT/sub-$n.log" 2>&1
    echo "$n rc=$? $(grep -E '^test result' "$OUT/sub-$n.log" | tail -1 | cut -c1-60) ($(( $(date +%s) - t0 )) s)"
    grep -E "panicked" "$OUT/sub-$n.log" | cut -c1-200 | head -4
  done ;;
wgmma)
  timeout 60 "$B/tests/fl-kernels__wgmma_probe" --test-threads=1 2>&1 | grep -E "^test |panicked|test result" | cut -c1-300
  for path in auto mma; do
    FL_PREFILL_PATH=$path timeout 200 "$B/tests/fl-kernels__attention_prefill" --test-threads=2 > "$OUT/prefill-$path.log" 2>&1
    echo "prefill tests FL_PREFILL_PATH=$path rc=$? $(grep -E '^test result' "$OUT/prefill-$path.log" | tail -1)"
    grep -E "panicked" "$OUT/prefill-$path.log" | cut -c1-250 | head -6
  done
  timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__attention_prefill" ragged --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tail -2 ;;
pbench)
  for path in auto mma; do
    FL_PREFILL_PATH=$path timeout 150 "$B/benches/attention_prefill" --bench --warm-up-time 0.1 --measurement-time 0.3 2>&1 | grep -E "^attn_prefill [a-z]" | sed "s/^/$path /"
    r=$(FL_PREFILL_PATH=$path timeout 100 "$B/bin/fl" bench --model llama-2-7b --runs 1:2048:2,16:512:2 2>&1 | grep -E "prefill:|rror" | awk '{printf "%s | ", $0}')
    echo "$path fl bench $r"
  done ;;
decode)
  timeout 200 "$B/tests/fl-kernels__attention" --test-threads=2 > "$OUT/attn.log" 2>&1
  echo "attention tests rc=$? $(grep -E '^test result' "$OUT/attn.log" | tail -1)"
  grep -E "panicked" "$OUT/attn.log" | cut -c1-250 | head -6
  for t in decode_paged_matches_dense decode_every_head_dim decode_sliding_window_and_forced_splits; do
    r=$(timeout 200 compute-sanitizer --tool memcheck "$B/tests/fl-kernels__attention" $t --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result" | tr '\n' ' ')
    echo "memcheck $t: $r"; done
  [ -f "$B/lab/decode.so" ] && timeout 200 python3 "$B/scripts/decode_lab.py" "$B/lab/decode.so" --check --bench --dtypes f16,bf16 --variants 0,1,2 2>&1 | grep -vE "Warn|warn| ok$"
  timeout 200 python3 "$B/scripts/compare.py" "$B/bin/optable" decode_attn 2>&1 | grep -vE "Warning|warn" | tail -20 ;;
lab)
  # the prefill kernels from bench/gpu/build_prefill_lab.sh libraries ($FL_LAB_LIBS) beside
  # torch's SDPA backends, one process per path
  for path in ${FL_LAB_PATHS:-auto mma}; do
    FL_PREFILL_PATH=$path timeout 200 python3 "$B/scripts/prefill_lab.py" $FL_LAB_LIBS ${FL_LAB_ARGS:---check --bench} 2>&1 | grep -vE "Warn|warn" | grep -vE " ok$"
  done ;;
esac; done
