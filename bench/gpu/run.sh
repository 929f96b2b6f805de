#!/usr/bin/env bash
# The GPU runner: stable targets over a bundle made by scripts/bundle.sh (which copies this
# file to the bundle's root). On the GPU machine:
#     bash .bundle/run.sh TARGET [ARGS...]          (from the repo: bash bench/gpu/run.sh ...)
# Targets; each prints as it goes and ends with a short table:
#   tests [--bench [NAME]]        every test binary with FL_REQUIRE_GPU=1 (run-bundle.sh)
#   memcheck [BIN[:FILTER]...]    compute-sanitizer memcheck per test binary (and name filter);
#                                 default: the kernel families' bounds and error-path tests
#   bench-ops [NAME] [-- ARGS]    criterion bench NAME (or those whose name contains NAME), ARGS to
#                                 each: `bench-ops gemv -- no_criterion_match` = gemv's summary lines
#   bench-engine [SET...] [-- FL_ARGS]  fl bench on the standard shapes; SET = 7b, 8b, quant
#                                 (int8 int4 q8_0 q4_0 w8a8) or one --quant name (default: 7b 8b
#                                 quant; one call per set stays inside a 10-minute call limit)
#   compare-torch [FILTER]        optable against PyTorch (compare.py), FILTER = key substrings
#   compare-torch generate [RUNS] transformers' generate on the engine shapes (torch_generate.py)
#   compare-torch check           the engine's logits against transformers (check_transformers.py)
#   compare-llamacpp              how the llama.cpp figures of PEERS.md are taken (not on this machine)
#   tp [check|bench]              tensor parallelism over the machine's first 2 GPUs (nvidia-h100-x2):
#                                 check = tp_gpu tests (FL_REQUIRE_TP=1) + check_transformers --tp 2;
#                                 bench = --tp 1 / 2 on llama-2-13b b1 and 64 x 1024, llama-2-70b
#                                 int4 b1 (--tp 2), torch_allreduce.py; default both (two calls)
#   serve-load [MODEL [CLIENTS...]]  fl serve MODEL on 127.0.0.1 (default bge-base: an encoder preset,
#                                 random weights) and fl_loadgen at CLIENTS (default 1 8 64; 16 requests
#                                 each) (--embeddings, 32 inputs of 16-128 tokens a request, for an
#                                 encoder; else completions of 512 + 256; FL_LOAD_ARGS adds arguments)
#   serve-compare [CLIENTS...]    issue 32's side by side on one random llama-2-7b f16 GGUF
#                                 (make_random_gguf.py; FL_GGUF to reuse one): llama-batched-bench at
#                                 64 x (512 + 256), then llama-server (-np 64, -fa on, FL_LLAMA: a
#                                 llama.cpp build with bin/ and lib/, default ../llama) and fl serve,
#                                 each at CLIENTS (default 1 8 64 256) and a shared-prefix run (64
#                                 clients, 384 of 512 prompt tokens shared); 512 + 256 tokens;
#                                 FL_SERVE_SERVERS picks the servers (default "llama-server fl";
#                                 llama-server-bs: with --backend-sampling; fl-cN: fl serve with
#                                 --max-prefill-tokens-beside-decodes N)
#   soak [SECONDS [MODEL]]        fl serve MODEL (default llama-2-7b) under 64 clients (prompts 64-1024,
#                                 outputs 16-512) for SECONDS (default 480), then the requests in flight
#                                 finish; failures, usage against /metrics, GPU memory and server RSS
#   soak-start [SECONDS [MODEL]]  the soak in a new process session, past this call (default 600 s);
#   soak-collect [WAIT]           in a later call on the same machine: wait for it, print its table
#   serve-stress [MODEL]          64 clients (512 + 256) while abuse_client.py sends bad requests and
#                                 holds 1,000 idle connections: both must come through
#   serve-check [ARGS]            fl serve on a small random LLaMA with a real tokenizer and chat
#                                 template (make_serve_model.py), then check_openai_client.py
#                                 (ARGS to it) against it: the openai package and curl. Without
#                                 `openai` importable, FL_WHEELS names a wheel folder to install from
#   step-profile [MODEL [PROMPT]] ncu per kernel over the last 8 decode steps of one sequence (default
#                                 llama-2-7b, 128-token prompt): the static engine beside the runner
#                                 (ncu_steps.py); the step's wall time minus the kernels is idle GPU
#   gguf-compare [TYPE...]        issue 33's speed rows: serve-compare's random llama-2-7b f16
#                                 GGUF, llama-quantize to each TYPE (default F16 Q8_0 Q4_K_M; F16 = the
#                                 f16 file itself, run first), then llama-bench (tg128, pp2048, -fa 1)
#                                 and fl bench (1 x 128 + 128, 1 x 2048) on the same file, and
#                                 teacher-forced logits of a ragged batch against llama.cpp's
#                                 (compare_llamacpp_logits.py, with the build's dump_logits); F16 is
#                                 the control, and each quantised row also shows its quantisation's
#                                 effect on each engine (rel L2 against its own F16 run); each
#                                 quantised file is removed after its row unless FL_KEEP_GGUF is set
#                                 (FL_LLAMA as serve-compare)
#   trace [runner|static K/N]     issue 31's trace (llama-2-7b f16, 1,000 requests at once, prompts
#                                 64-4096, outputs 16-1024): the runner, or part K of N of the
#                                 static batches (the static side takes longer than one call: run
#                                 its parts in calls of their own; output tokens and seconds add)
#   floor                         the 1 GiB copy bandwidth, the read-only floor (read_floor.cu),
#                                 cuBLAS f16 / int8 GEMM at 4096^3 through PyTorch
#   ab A B [-n N] -- CMD...       CMD in bundle A's folder, then B's, N rounds (default 3), then each
#                                 figure's median side by side (fl bench tokens/s; optable, gemv summary
#                                 and criterion times): `ab /tmp/base .bundle -- bin/fl bench --model ...`
# Environment: FL_BUNDLE (default: this folder if it holds bin/, else the repo's .bundle),
# FL_LOGS (logs, default /tmp/fl-run), FL_RUNS (bench-engine's --runs for every set).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-help}" in help|-h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
if [ -n "${FL_BUNDLE:-}" ]; then B="$FL_BUNDLE"
elif [ -d "$HERE/bin" ]; then B="$HERE"
else B="$HERE/../../.bundle"; fi
B="$(cd "$B" 2>/dev/null && pwd)" || { echo "run.sh: no bundle at ${FL_BUNDLE:-$HERE/../../.bundle}" >&2; exit 2; }
LOGS="${FL_LOGS:-/tmp/fl-run}"; mkdir -p "$LOGS"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export FL_REQUIRE_GPU=1
TAB=$'\t'

# Tab-separated lines on stdin (the first is the header) as a markdown table.
show_table() {
  echo
  awk -F'\t' '{ printf "|"; for (i = 1; i <= NF; i++) printf " %s |", $i; print ""
                if (NR == 1) { printf "|"; for (i = 1; i <= NF; i++) printf "---|"; print "" } }'
}

t_tests() {
  bash "$B/run-bundle.sh" "$@" 2>&1 | tee "$LOGS/tests.log"; local rc=${PIPESTATUS[0]}
  { echo "test binary${TAB}passed${TAB}status"
    sed -nE "s/^ok +([^:]+): ([0-9]+) passed.*/\1${TAB}\2${TAB}ok/p; s/^FAIL ([^ ]+) \(exit ([0-9]+)\).*/\1${TAB}-${TAB}FAIL (exit \2)/p" "$LOGS/tests.log"
    echo "all${TAB}$(tail -1 "$LOGS/tests.log")${TAB}rc $rc"; } | show_table
  return "$rc"
}

t_memcheck() {
  local specs=("$@") s bin filt log rc res err bad=0 rows=()
  [ ${#specs[@]} -gt 0 ] || specs=(fl-kernels__gemv:one_token fl-kernels__gemv:multi_token
    fl-kernels__attention:decode_paged fl-kernels__attention:decode_ragged
    fl-kernels__attention_prefill:ragged fl-kernels__embedding:bad_ids fl-kernels__padding
    fl-kernels__rope:invalid fl-kernels__kv_cache:invalid fl-kernels__activation:swiglu)
  local cs; cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  for s in "${specs[@]}"; do
    bin=${s%%:*}; filt=""; [ "$s" != "$bin" ] && filt=${s#*:}
    log="$LOGS/memcheck-$bin-${filt:-all}.log"
    timeout "${FL_MEMCHECK_TIMEOUT:-300}" "$cs" --tool memcheck "$B/tests/$bin" ${filt:+"$filt"} --test-threads=1 > "$log" 2>&1; rc=$?
    res=$(grep -E '^test result' "$log" | tail -1 | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\1 passed, \2 failed/')
    err=$(grep -E 'ERROR SUMMARY' "$log" | tail -1 | sed -E 's/.*ERROR SUMMARY: ([0-9]+).*/\1/')
    echo "memcheck $bin ${filt:-(all)}: rc=$rc ${res:-no test result}, errors ${err:-?}"
    [ "$rc" = 0 ] && [ "${err:-1}" = 0 ] && [ -n "$res" ] || bad=1
    rows+=("$bin$TAB${filt:-(all)}$TAB${res:--}$TAB${err:-?}$TAB$rc")
  done
  { echo "test binary${TAB}filter${TAB}tests${TAB}memcheck errors${TAB}exit"; printf '%s\n' "${rows[@]}"; } | show_table
  return "$bad"
}

t_bench_ops() {
  local name="" b n rc t0 cases lines rows=()
  if [ $# -gt 0 ] && [ "$1" != "--" ]; then name=$1; shift; fi
  [ "${1:-}" = "--" ] && shift
  for b in "$B"/benches/*; do
    [ -x "$b" ] || continue; n=$(basename "$b")
    case "$n" in *"$name"*) ;; *) continue ;; esac
    [ -x "$B/benches/$name" ] && [ "$n" != "$name" ] && continue  # an exact name runs alone
    echo "== bench $n"; t0=$(date +%s)
    timeout "${FL_BENCH_TIMEOUT:-600}" "$b" --bench "$@" > "$LOGS/bench-$n.log" 2>&1; rc=$?
    # One line per criterion case (median time, median throughput); a line of its own with a
    # space in it (not criterion's) is the bench's summary line (gemv, gemm, attn_prefill ...).
    awk -v f="$LOGS/bench-$n.count" '
      /^(Benchmarking|Found|Gnuplot|Warning|WARNING|Performance|No change|Change within)/ { next }
      /time:/ { if ($1 != "time:") id = $1; split($0, a, "["); split(a[2], v, " "); t = v[3] " " v[4]; c++; p = 1; next }
      /thrpt:/ && p { split($0, a, "["); split(a[2], v, " "); printf "%-56s %14s %18s\n", id, t, v[3] " " v[4]; p = 0; next }
      p { printf "%-56s %14s\n", id, t; p = 0 }
      /^[^ ]+ / { print; l++; next }
      /^[^ ]/ { id = $1 }
      END { if (p) printf "%-56s %14s\n", id, t; print c + 0, l + 0 > f }' "$LOGS/bench-$n.log"
    read -r cases lines < "$LOGS/bench-$n.count"
    rows+=("$n$TAB$rc$TAB$cases$TAB$lines$TAB$(( $(date +%s) - t0 ))")
  done
  { echo "bench${TAB}exit${TAB}criterion cases${TAB}summary lines${TAB}seconds"; printf '%s\n' "${rows[@]}"; } | show_table
}

# jget KEY LINE: one field of fl bench's --json line.
jget() { sed -nE "s/.*\"$1\":\"?([^,\"}]*).*/\1/p" <<< "$2"; }

t_bench_engine() {
  local sets=() extra=() s q line rows=()
  while [ $# -gt 0 ]; do [ "$1" = "--" ] && { shift; extra=("$@"); break; }; sets+=("$1"); shift; done
  [ ${#sets[@]} -gt 0 ] || sets=(7b 8b quant)
  run_fl() {  # MODEL QUANT RUNS
    echo "== fl bench --model $1 --quant $2 --runs $3 ${extra[*]}" >&2
    timeout "${FL_ENGINE_TIMEOUT:-580}" "$B/bin/fl" bench --json --model "$1" --quant "$2" --runs "$3" "${extra[@]}" 2>&1 | tee -a "$LOGS/bench-engine.log" |
    while IFS= read -r line; do echo "  $line" >&2; case "$line" in
      \{*) echo "$1$TAB$(jget dtype "$line")$TAB$2$TAB$(jget batch "$line") x $(jget prompt_len "$line"), $(jget gen_len "$line")$TAB$(jget prefill_tokens_per_s "$line")$TAB$(jget decode_tokens_per_s "$line")$TAB$(jget ms_per_step "$line")$TAB$(jget pct_of_floor "$line")%$TAB$(jget copy_gbps "$line")" ;;
      batch*) echo "$1$TAB-$TAB$2$TAB$line$TAB$TAB$TAB$TAB$TAB" ;;
    esac; done
  }
  for s in "${sets[@]}"; do case "$s" in
    7b) mapfile -t -O "${#rows[@]}" rows < <(run_fl llama-2-7b none "${FL_RUNS:-1:128:128,16:1024:64,64:1024:64,16:4032:64,1:4032:64,1:2048:2,16:512:2}") ;;
    8b) mapfile -t -O "${#rows[@]}" rows < <(run_fl llama-3-8b none "${FL_RUNS:-1:128:128,1:4032:64,16:4032:64,64:1024:64}") ;;
    quant) for q in int8 int4 q8_0 q4_0 w8a8; do mapfile -t -O "${#rows[@]}" rows < <(run_fl llama-2-7b "$q" "${FL_RUNS:-1:128:128,16:512:32,1:2048:2}"); done ;;
    *) mapfile -t -O "${#rows[@]}" rows < <(run_fl llama-2-7b "$s" "${FL_RUNS:-1:128:128,16:512:32,1:2048:2}") ;;
  esac; done
  { echo "model${TAB}dtype${TAB}quant${TAB}batch x prompt, gen${TAB}prefill tok/s${TAB}decode tok/s${TAB}ms/step${TAB}% of floor${TAB}copy GB/s"
    printf '%s\n' "${rows[@]}"; } | show_table
}

t_compare_torch() {
  case "${1:-}" in
  generate)
    python3 -u "$B/scripts/torch_generate.py" --runs "${2:-1:128:128,16:1024:64,64:1024:64,1:2048:2,16:512:2}" \
      --modes "${FL_TORCH_MODES:-eager,compile}" 2>&1 | grep --line-buffered -vE 'Warning|warn' | tee "$LOGS/torch-generate.log"
    { echo "transformers run${TAB}result"; sed -nE "s/^transformers +([a-z]+ +b[0-9]+ p[0-9]+ g[0-9]+): (.*)/\1${TAB}\2/p" "$LOGS/torch-generate.log"; } | show_table ;;
  check)  # its own table and PASS / FAIL line come last
    python3 -u "$B/scripts/check_transformers.py" --fl "$B/bin/fl" --workdir "$LOGS/check" 2>&1 | grep --line-buffered -vE 'Warning|Writing|deprecated' ;;
  *)
    python3 -u "$B/scripts/compare.py" "$B/bin/optable" "${1:-}" --md "$LOGS/compare.md" 2>&1 | grep --line-buffered -vE 'Warning|warn'
    { echo "rows${TAB}slower than torch's best${TAB}lowest speed-up"
      awk -F'|' '/x \|$/ { r++; v = $(NF-1) + 0; if (v < 1) s++; if (lo == "" || v < lo) lo = v }
                 END { printf "%d\t%d\t%sx\n", r, s, lo }' "$LOGS/compare.md"; } | show_table ;;
  esac
}

# NCCL as cudarc loads it (libnccl.so), multicast off as the multi-GPU machines require.
tp_env() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local lib; lib=$(ls /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/local/cuda/lib64/libnccl.so.2 2>/dev/null | head -1)
  if [ -n "$lib" ]; then mkdir -p "$LOGS/nccl"; ln -sf "$lib" "$LOGS/nccl/libnccl.so"
    export LD_LIBRARY_PATH="$LOGS/nccl:$LD_LIBRARY_PATH"; fi
}

t_tp() {
  tp_env
  local what="${1:-all}" rows=() line
  if [ "$what" = all ] || [ "$what" = check ]; then
    FL_REQUIRE_TP=1 timeout 300 "$B/tests/fl-engine__tp_gpu" --test-threads=1 --nocapture 2>&1 | tee "$LOGS/tp-tests.log" |
      grep --line-buffered -E "^test |worst|surfaced|test result"
    python3 -u "$B/scripts/check_transformers.py" --fl "$B/bin/fl" --tp 2 --dtypes f32,f16 --workdir "$LOGS/check-tp" 2>&1 |
      grep --line-buffered -E "PASS|FAIL"
  fi
  [ "$what" = all ] || [ "$what" = bench ] || return 0
  tp_row() {  # MODEL QUANT BATCH PROMPT GEN TP
    timeout 200 "$B/bin/fl" bench --json --runner --max-model-len 2048 --model "$1" --quant "$2" --batch "$3" \
      --prompt-len "$4" --gen-len "$5" --tp "$6" 2>&1 | tee -a "$LOGS/tp-bench.log" | grep '"runner":true' |
      while IFS= read -r line; do echo "$1$TAB$2$TAB$3 x $4, $5$TAB$6$TAB$(jget output_tokens_per_s "$line")$TAB$(jget decode_ms_per_step "$line")$TAB$(jget pct_of_floor "$line")%$TAB$(jget all_reduce_us "$line")$TAB$(jget preemptions "$line")"; done
  }
  for tp in 1 2; do
    mapfile -t -O "${#rows[@]}" rows < <(tp_row llama-2-13b none 1 128 256 "$tp")
    mapfile -t -O "${#rows[@]}" rows < <(tp_row llama-2-13b none 64 1024 128 "$tp")
  done
  mapfile -t -O "${#rows[@]}" rows < <(tp_row llama-2-70b int4 1 128 128 2)
  timeout 120 python3 "$B/scripts/torch_allreduce.py" 2>&1 | grep -E "^\||^torch"
  { echo "model${TAB}quant${TAB}batch x prompt, gen${TAB}--tp${TAB}output tok/s${TAB}decode ms/step${TAB}% of floor${TAB}all-reduce us${TAB}preemptions"
    printf '%s\n' "${rows[@]}"; } | show_table
}

# Starts a server in the background (output in $LOGS/NAME.log) and waits up to WAIT seconds for
# /health to answer 200 on PORT; SERVER_PID is its pid. Returns 1 if it exits or never gets ready.
start_server() {  # NAME PORT WAIT CMD...
  local name="$1" port="$2" wait="$3"; shift 3
  "$@" > "$LOGS/$name.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 "$wait"); do
    curl -s -o /dev/null -w "%{http_code}" "http://127.0.0.1:$port/health" 2>/dev/null | grep -q 200 && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "$name exited: $(tail -3 "$LOGS/$name.log")" >&2; return 1; }
    sleep 1
  done
  echo "$name: not ready after ${wait}s: $(tail -3 "$LOGS/$name.log")" >&2
  kill "$SERVER_PID" 2>/dev/null; return 1
}
stop_server() { kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; }

# One table row (tab-separated) from fl_loadgen's JSON line: LABEL CLIENTS LINE.
load_row() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
m, c, line = sys.argv[1:4]
try:
    v = json.loads(line)
except ValueError:
    print(f"{m}\t{c}\tno report: {line[:80]}"); sys.exit()
g = lambda k, p: (v.get(k) or {}).get(p, "-")
# Requests that needed a fresh connection (fl_loadgen retries connection-level failures).
failed = f'{v["failed"]} ({v["retried"]} retried)' if v.get("retried") else v["failed"]
print("\t".join(str(x) for x in [m, c, v["completed"], failed, v["request_throughput"],
      v.get("input_throughput", "-"), v["output_throughput"], g("ttft_ms", "p50"), g("ttft_ms", "p99"),
      g("itl_ms", "p50"), g("itl_ms", "p99"), g("e2e_ms", "p50")]))
PY
}
LOAD_HEADER="server${TAB}clients${TAB}completed${TAB}failed${TAB}req/s${TAB}inputs/s${TAB}output tok/s${TAB}TTFT p50 ms${TAB}TTFT p99 ms${TAB}ITL p50 ms${TAB}ITL p99 ms${TAB}E2E p50 ms"

t_serve_load() {
  local model="${1:-bge-base}" port=8431 rows=() c line
  local args=(--prompt-lens 512 --output-lens 256)
  case "$model" in bert-*|bge-*) args=(--embeddings --inputs-per-request 32 --prompt-lens 16-128 --vocab-size 30522) ;; esac
  [ $# -gt 0 ] && shift; local clients=("$@"); [ ${#clients[@]} -gt 0 ] || clients=(1 8 64)
  start_server serve-load "$port" 300 "$B/bin/fl" serve --model "$model" --port "$port" || return 1
  for c in "${clients[@]}"; do
    # FL_LOAD_ARGS: more fl_loadgen arguments, e.g. "--shared-prefix 384".
    # shellcheck disable=SC2086
    line=$(timeout 200 "$B/bin/fl_loadgen" --base-url "http://127.0.0.1:$port" --json --concurrency "$c" \
      --num-prompts $((c * 16)) --max-duration 150 "${args[@]}" ${FL_LOAD_ARGS:-} 2>&1 | tail -1)
    echo "  $line" >&2
    rows+=("$(load_row "$model" "$c" "$line")")
  done
  stop_server
  { echo "$LOAD_HEADER"; printf '%s\n' "${rows[@]}"; } | show_table
}

# The llama.cpp build (FL_LLAMA, default ../llama beside the bundle) as L, and LENV: env with its
# lib/ first. Fails, naming TARGET, when it has no bin/TOOL.
use_llama() {  # TARGET TOOL
  L="${FL_LLAMA:-$B/../llama}"
  LENV=(env "LD_LIBRARY_PATH=$L/lib:$LD_LIBRARY_PATH")
  [ -x "$L/bin/$2" ] || { echo "$1: no llama.cpp build at $L (FL_LLAMA)" >&2; return 2; }
}

# The random llama-2-7b f16 GGUF both engines read (FL_GGUF, default in $LOGS), made once per
# machine by make_random_gguf.py; GGUF is its path.
use_random_gguf() {
  GGUF="${FL_GGUF:-$LOGS/llama-2-7b-f16.gguf}"
  [ -s "$GGUF" ] || python3 "$B/scripts/make_random_gguf.py" "$GGUF" >&2
}

# Issue 32's side by side: one random-weight GGUF served by llama-server and by fl serve.
t_serve_compare() {
  local port=8433 rows=() c n line srv
  local clients=("$@"); [ ${#clients[@]} -gt 0 ] || clients=(1 8 64 256)
  local args=(--prompt-lens 512 --output-lens 256 --vocab-size 32000)
  use_llama serve-compare llama-server || return 2
  use_random_gguf || return 1
  local gguf="$GGUF" lenv=("${LENV[@]}")
  # The peer's own batched decode at 64 x (512 + 256): what its server should come close to.
  timeout 240 "${lenv[@]}" "$L/bin/llama-batched-bench" -m "$gguf" -ngl 99 -fa on -c $((64 * 800)) \
    -b 2048 -ub 512 -npp 512 -ntg 256 -npl 64 > "$LOGS/batched-bench.log" 2>&1
  grep -E '^\|' "$LOGS/batched-bench.log" >&2
  # FL_SERVE_SERVERS: which servers, in order (default "llama-server fl"); llama-server-bs is
  # llama-server with --backend-sampling (its experimental GPU sampling), fl-cN fl serve with
  # --max-prefill-tokens-beside-decodes N.
  for srv in ${FL_SERVE_SERVERS:-llama-server fl}; do
    if [ "${srv#llama-server}" != "$srv" ]; then
      local more=(); [ "$srv" = llama-server-bs ] && more=(--backend-sampling)
      # 64 slots of 800 tokens (512 + 256 and room), flash attention, a thread per client.
      # --cache-ram 0: llama-server's host-RAM prompt cache (default 8 GiB) saves a slot's
      # whole KV state (383 MiB at 767 tokens of this model) to host memory each time the slot
      # takes a new request, and evicts older entries one by one to make room, ~0.3 s each on
      # the server's one loop: with 8 clients and more it did little else (2026-11-28, H100:
      # 80 output tok/s at 8 clients with a 65 s p90 TTFT, nothing finished in 180 s at 64).
      # Each slot still reuses its own cached prefix (cache_prompt), as the shared-prefix row
      # needs.
      start_server "$srv" "$port" 300 "${lenv[@]}" "$L/bin/llama-server" -m "$gguf" -ngl 99 \
        -fa on -np 64 -c $((64 * 800)) -b 2048 -ub 512 --threads-http 288 --cache-ram 0 \
        "${more[@]}" --host 127.0.0.1 --port "$port" --no-webui || continue
    else
      local flargs=(); [ "${srv#fl-c}" != "$srv" ] && flargs=(--max-prefill-tokens-beside-decodes "${srv#fl-c}")
      start_server "$srv" "$port" 300 "$B/bin/fl" serve --model "$gguf" --port "$port" "${flargs[@]}" || continue
    fi
    for c in "${clients[@]}" shared64; do
      local extra=() cc="$c"
      # The shared-system-prompt workload: 64 clients whose prompts share their first 384 tokens.
      [ "$c" = shared64 ] && { cc=64; extra=(--shared-prefix 384); }
      n=$((cc * 4)); [ "$n" -lt 8 ] && n=8; [ "$n" -gt 512 ] && n=512
      line=$(timeout 200 "$B/bin/fl_loadgen" --base-url "http://127.0.0.1:$port" --json --concurrency "$cc" \
        --num-prompts "$n" --max-duration 180 --seed "$cc" "${args[@]}" "${extra[@]}" \
        --save-result "$LOGS/requests-$srv-$c.jsonl" 2>&1 | tail -1)
      echo "  $srv $c: $line" >&2
      rows+=("$(load_row "$srv" "$c" "$line")")
      # The server's own counters after each row (fl serve: step times by kind).
      curl -s "http://127.0.0.1:$port/metrics" > "$LOGS/metrics-$srv-$c.txt" 2>/dev/null
    done
    stop_server
  done
  { echo "$LOAD_HEADER"; printf '%s\n' "${rows[@]}"; } | show_table
  # Where the long inter-token gaps of the 64-client rows come from (itl_breakdown.py).
  local m=() f
  for f in "$LOGS"/metrics-fl*-64.txt; do [ -s "$f" ] && m+=(--metrics "$f"); done
  python3 "$B/scripts/itl_breakdown.py" "$LOGS"/requests-*-64.jsonl "${m[@]}" 2>&1 || true
}

# A soak at saturation: 64 clients for SECONDS, then the requests in flight finish.
t_soak() {
  local secs="${1:-480}" model="${2:-llama-2-7b}" port=8434 line sampler
  start_server fl-soak "$port" 300 "$B/bin/fl" serve --model "$model" --port "$port" || return 1
  curl -s "http://127.0.0.1:$port/metrics" > "$LOGS/soak-metrics-before.txt"
  ( while kill -0 "$SERVER_PID" 2>/dev/null; do
      echo "$(date +%s) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1) $(awk '/VmRSS/ {print $2}' "/proc/$SERVER_PID/status")"
      sleep 10
    done ) > "$LOGS/soak-mem.txt" 2>/dev/null &
  sampler=$!
  line=$(timeout $((secs + 120)) "$B/bin/fl_loadgen" --base-url "http://127.0.0.1:$port" --json \
    --concurrency 64 --num-prompts 1000000 --prompt-lens 64-1024 --output-lens 16-512 \
    --send-duration "$secs" --max-duration $((secs + 90)) 2>&1 | tail -1)
  curl -s "http://127.0.0.1:$port/metrics" > "$LOGS/soak-metrics-after.txt"
  kill "$sampler" 2>/dev/null; stop_server
  python3 - "$line" "$LOGS" <<'PY'
import json, sys
line, logs = sys.argv[1:3]
try:
    v = json.loads(line)
except ValueError:
    sys.exit(f"soak: no loadgen report: {line[:200]}")
def metrics(path):
    out = {}
    for ln in open(path):
        if ln.startswith("fl_") and "{" not in ln.split(" ")[0]:
            k, x = ln.rsplit(" ", 1)
            out[k] = float(x)
    return out
a, b = metrics(f"{logs}/soak-metrics-before.txt"), metrics(f"{logs}/soak-metrics-after.txt")
d = lambda k: b.get(k, 0) - a.get(k, 0)
mem = [ln.split() for ln in open(f"{logs}/soak-mem.txt") if len(ln.split()) == 3]
t0 = int(mem[0][0]) if mem else 0
warm = [m for m in mem if int(m[0]) - t0 >= 60]
p = lambda k, q: (v.get(k) or {}).get(q, "-")
rows = [("requests completed / failed / cancelled / not sent", f"{v['completed']} / {v['failed']} / {v['cancelled']} / {v['not_sent']}"),
        ("held back at --send-duration (not sent, by design)", v.get("held_back")),
        ("outputs != max_tokens / prompt usage mismatches", f"{v['outputs_not_max_tokens']} / {v['prompt_tokens_mismatch']}"),
        ("loadgen input / output tokens", f"{v['input_tokens']} / {v['output_tokens']}"),
        ("/metrics prompt / generation tokens (delta, warm-up request included)", f"{d('fl_prompt_tokens_total'):.0f} / {d('fl_generation_tokens_total'):.0f}"),
        ("/metrics failures (delta)", f"{d('fl_request_failure_total'):.0f}"),
        ("output tok/s, duration s", f"{v['output_throughput']}, {v['duration_s']}"),
        ("TTFT p50 / p99 ms; ITL p50 / p99 ms", f"{p('ttft_ms', 'p50')} / {p('ttft_ms', 'p99')}; {p('itl_ms', 'p50')} / {p('itl_ms', 'p99')}")]
if warm:
    g = [int(m[1]) for m in warm]; r = [int(m[2]) for m in warm]
    rows += [("GPU memory MiB after 60 s: first / min / max / last", f"{g[0]} / {min(g)} / {max(g)} / {g[-1]}"),
             ("server RSS MiB after 60 s: first / min / max / last", f"{r[0]//1024} / {min(r)//1024} / {max(r)//1024} / {r[-1]//1024}")]
print("\n| soak | |\n|---|---|")
for k, x in rows:
    print(f"| {k} | {x} |")
PY
}

# A soak longer than one device call (10 minutes and more): soak-start runs `soak` in a new
# process session (the machine keeps it past the call) with its logs under /tmp/fl-soak;
# soak-collect, in a later call on the same warm machine, waits for it (up to WAIT seconds,
# default 560) and prints its table, copying its logs into LOGS. A 600 s soak outlasts one
# 10-minute call by the load's drain and the server's start: chain three calls (soak-start
# then soak-collect 560 in the first, soak-collect again in the second and, if it says so, a
# third), each within 30 s of the last, or the machine is given back with the soak on it.
SOAK_DIR=/tmp/fl-soak
t_soak_start() {
  local secs="${1:-600}" model="${2:-llama-2-7b}"
  rm -rf "$SOAK_DIR"; mkdir -p "$SOAK_DIR/logs"
  FL_LOGS="$SOAK_DIR/logs" setsid bash -c 'bash "$1" soak "$2" "$3"; echo $? > "$4/rc"' _ \
    "$HERE/run.sh" "$secs" "$model" "$SOAK_DIR" > "$SOAK_DIR/out.txt" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid" > "$SOAK_DIR/pid"
  # The latest the soak can end: the load, its --max-duration drain (90 s), the server's start.
  echo $(( $(date +%s) + secs + 90 + 300 )) > "$SOAK_DIR/latest_end"
  # Back once the load is running (the server answered its warm-up), or the soak ended.
  for _ in $(seq 1 300); do
    grep -q . "$SOAK_DIR/logs/soak-metrics-before.txt" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  echo "soak-start: pid $pid, ${secs} s of load from $(date +%T); collect with soak-collect" >&2
  tail -3 "$SOAK_DIR/out.txt" >&2
}
t_soak_collect() {
  local wait="${1:-560}" pid
  pid="$(cat "$SOAK_DIR/pid" 2>/dev/null)" || { echo "soak-collect: no soak-start on this machine" >&2; return 2; }
  for _ in $(seq 1 "$wait"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  cp -r "$SOAK_DIR/logs/." "$LOGS/" 2>/dev/null
  if kill -0 "$pid" 2>/dev/null; then
    local left=$(( $(cat "$SOAK_DIR/latest_end" 2>/dev/null || date +%s) - $(date +%s) ))
    echo "soak-collect: still running after ${wait} s (at most ${left} s left); run soak-collect again within 30 s" >&2
    return 1
  fi
  cat "$SOAK_DIR/out.txt"
  return "$(cat "$SOAK_DIR/rc" 2>/dev/null || echo 1)"
}

# Misbehaving clients and 1,000 idle connections while 64 clients load the server.
t_serve_stress() {
  local model="${1:-llama-2-7b}" port=8435 line load rc
  ulimit -n 8192 2>/dev/null || true
  start_server fl-stress "$port" 300 "$B/bin/fl" serve --model "$model" --port "$port" || return 1
  timeout 200 "$B/bin/fl_loadgen" --base-url "http://127.0.0.1:$port" --json --concurrency 64 \
    --num-prompts 256 --prompt-lens 512 --output-lens 256 --max-duration 180 > "$LOGS/stress-load.json" 2>&1 &
  load=$!
  sleep 2
  timeout 180 python3 "$B/scripts/abuse_client.py" --base-url "http://127.0.0.1:$port" --rounds 5 \
    --hold 1000 --max-seconds 150 2>&1 | tee "$LOGS/stress-abuse.log" | grep -E '^FAIL|^summary' >&2
  rc=${PIPESTATUS[0]}
  wait "$load"; line=$(tail -1 "$LOGS/stress-load.json")
  stop_server
  { echo "$LOAD_HEADER"; load_row "fl (under abuse)" 64 "$line"; } | show_table
  echo "abuse_client: $(grep '^summary' "$LOGS/stress-abuse.log") (exit $rc)"
}

t_serve_check() {
  local port=8432 dir="$LOGS/serve-model" rc
  python3 "$B/scripts/make_serve_model.py" "$dir" >&2 || { echo "serve-check: could not make the model" >&2; return 1; }
  if ! python3 -c 'import openai' 2>/dev/null && [ -n "${FL_WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --find-links "$FL_WHEELS" --target "$LOGS/py" openai >&2 &&
      export PYTHONPATH="$LOGS/py${PYTHONPATH:+:$PYTHONPATH}"
  fi
  start_server serve-check "$port" 120 "$B/bin/fl" serve --model "$dir" --port "$port" || return 1
  timeout "${FL_CHECK_TIMEOUT:-300}" python3 "$B/scripts/check_openai_client.py" \
    --base-url "http://127.0.0.1:$port" --timeout 60 "$@" 2>&1 | tee "$LOGS/serve-check-client.log"
  rc=${PIPESTATUS[0]}
  stop_server
  tail -5 "$LOGS/serve-check.log" >&2
  return "$rc"
}

# ncu's per-kernel times of the last 16 decode steps: the static engine against the runner.
t_step_profile() {
  local model="${1:-llama-2-7b}" prompt="${2:-128}" ncu
  ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
  local m=(--csv --print-units base --metrics gpu__time_duration.sum --clock-control none --cache-control none)
  # 14 new tokens, the last 8 steps compared: ~2,700 kernels a run under ncu (~1-1.5 minutes;
  # 24 tokens took ~2 minutes a run, and the pair did not fit a 10-minute call beside other work).
  echo "[{\"arrival_s\": 0.0, \"prompt_len\": $prompt, \"output_len\": 14}]" > "$LOGS/one.json"
  timeout 240 "$ncu" "${m[@]}" "$B/bin/fl" bench --model "$model" --runs "1:$prompt:14" > "$LOGS/ncu-static.csv" 2> "$LOGS/ncu-static.err"
  timeout 240 "$ncu" "${m[@]}" "$B/bin/fl" bench --model "$model" --trace-file "$LOGS/one.json" > "$LOGS/ncu-runner.csv" 2> "$LOGS/ncu-runner.err"
  (cd "$LOGS" && python3 "$B/scripts/ncu_steps.py" ncu-static.csv ncu-runner.csv --steps 8)
}

# Issue 33's speed rows: llama.cpp and fl on the same GGUF files, made from one random f16 file
# by llama-quantize, one format after another (files live only as long as the machine).
t_gguf_compare() {
  local dir="${FL_GGUF_DIR:-$LOGS/gguf}" rows=() t f
  local formats=("$@"); [ ${#formats[@]} -gt 0 ] || formats=(F16 Q8_0 Q4_K_M)
  # F16 first: the control of the logits check, and each quantised row's yardstick.
  case " ${formats[*]} " in *" F16 "*) formats=(F16 $(printf '%s\n' "${formats[@]}" | grep -vx F16)) ;; esac
  use_llama gguf-compare llama-bench || return 2
  use_random_gguf || return 1
  local f16="$GGUF" lenv=("${LENV[@]}")
  mkdir -p "$dir"
  for t in "${formats[@]}"; do
    f="$dir/$t.gguf"
    [ "$t" = F16 ] && f="$f16"
    [ -s "$f" ] || timeout 300 "${lenv[@]}" "$L/bin/llama-quantize" "$f16" "$f" "$t" \
      > "$LOGS/quantize-$t.log" 2>&1 || { echo "gguf-compare: llama-quantize $t failed: $(tail -2 "$LOGS/quantize-$t.log")" >&2; continue; }
    timeout 240 "${lenv[@]}" "$L/bin/llama-bench" -m "$f" -p 2048 -n 128 -fa 1 -ngl 99 -o jsonl \
      > "$LOGS/llama-bench-$t.jsonl" 2> "$LOGS/llama-bench-$t.err"
    timeout 240 "$B/bin/fl" bench --model "$f" --runs 1:128:128,1:2048:2 --json \
      > "$LOGS/fl-bench-$t.jsonl" 2> "$LOGS/fl-bench-$t.err"
    # Teacher-forced logits on a ragged batch (16 prompts of 1-129 tokens, 8 steps) against
    # llama.cpp's for the same sequences (bench/llamacpp/dump_logits in the llama build).
    local cmp="-"
    if [ -x "$L/bin/dump_logits" ]; then
      [ -s "$LOGS/logits-in.json" ] || python3 "$B/scripts/compare_llamacpp_logits.py" \
        --input "$LOGS/logits-in.json" --make-input 16 >&2
      timeout 200 "$B/bin/fl" logits --model "$f" --input "$LOGS/logits-in.json" \
        --out "$LOGS/fl-logits-$t.json" > "$LOGS/fl-logits-$t.err" 2>&1
      local vs=()
      [ "$t" != F16 ] && [ -s "$LOGS/fl-logits-F16.json" ] && [ -s "$LOGS/ref-F16.npy" ] &&
        vs=(--vs-f16 "$LOGS/fl-logits-F16.json" "$LOGS/ref-F16.npy")
      cmp="$(timeout 200 "${lenv[@]}" python3 "$B/scripts/compare_llamacpp_logits.py" --gguf "$f" \
        --input "$LOGS/logits-in.json" --fl "$LOGS/fl-logits-$t.json" --dump-logits "$L/bin/dump_logits" \
        --save-ref "$LOGS/ref-$t.npy" "${vs[@]}" 2>&1 | tee "$LOGS/compare-$t.log" |
        grep -E '^(summary|quantisation)' | tr '\n' ' ')"
      [ -n "$cmp" ] || cmp="- (see compare-$t.log)"
    fi
    rows+=("$(python3 - "$t" "$LOGS/llama-bench-$t.jsonl" "$LOGS/fl-bench-$t.jsonl" "$cmp" <<'PY'
import json, re, sys
t, lp, fp, cmp = sys.argv[1:5]
def lines(p):
    out = []
    for ln in open(p):
        try:
            out.append(json.loads(ln))
        except ValueError:
            pass
    return out
ll, fl = lines(lp), lines(fp)
tg = next((v["avg_ts"] for v in ll if v.get("n_gen") == 128), None)
pp = next((v["avg_ts"] for v in ll if v.get("n_prompt") == 2048), None)
dec = next((v["decode_tokens_per_s"] for v in fl if v.get("prompt_len") == 128), None)
pre = next((v["prefill_tokens_per_s"] for v in fl if v.get("prompt_len") == 2048), None)
f = lambda x: "-" if x is None else f"{x:,.1f}"
r = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}x"
m = re.search(r"top-1 agreement (\S+) \(([^)]*)\), rel L2 max ([0-9.e+-]+)", cmp)
logits = f"{m.group(1)} ({m.group(2)}), {m.group(3)}" if m else cmp
# The quantisation's own effect on each engine (rel L2 mean against its F16 run).
q = re.findall(r"(fl vs fl F16|llama.cpp vs llama.cpp F16): top-1 (\S+), rel L2 mean (\S+)", cmp)
quant = " / ".join(f"{v} ({a})" for _, a, v in q) if q else "-"
print("\t".join([t, f(tg), f(dec), r(dec, tg), f(pp), f(pre), r(pre, pp), logits, quant]))
PY
)")
    [ "$t" = F16 ] || [ -n "${FL_KEEP_GGUF:-}" ] || rm -f "$f"
  done
  { echo "file${TAB}llama.cpp tg128 tok/s${TAB}fl decode b1 tok/s${TAB}fl / llama.cpp${TAB}llama.cpp pp2048 tok/s${TAB}fl prefill 2048 tok/s${TAB}fl / llama.cpp${TAB}logits: top-1 agree, rel L2 max${TAB}vs own F16: fl / llama.cpp rel L2 mean (top-1)"
    printf '%s\n' "${rows[@]}"; } | show_table
}

t_trace() {
  local side="${1:-runner}" part="${2:-1/1}" extra=()
  [ "$side" = static ] && extra=(--trace-static-part "$part")
  timeout "${FL_TRACE_TIMEOUT:-580}" "$B/bin/fl" bench --json --model llama-2-7b --trace 1000 \
    --prompt-lens 64-4096 --output-lens 16-1024 "${extra[@]}" 2>&1 | tee "$LOGS/trace-$side.log" |
    grep -E '^\{"trace'
}

t_compare_llamacpp() {
  cat <<'EOF2'
llama.cpp is not on the GPU machine and this runner does not build it. PEERS.md's figures were
taken on the same kind of H100 (the 2026-11-27 side-by-side in the same session as ours, llama.cpp
0c1e570): its CUDA backend built for Hopper, flash attention on, every layer on the GPU,
random-weight GGUFs of our presets' shapes (f16, q8_0, q4_0). Row by row:
EOF2
  { echo "row${TAB}llama.cpp tool${TAB}ours (bash run.sh ...)"
    echo "decode b1 f16 / q8_0 / q4_0${TAB}llama-bench, tg128${TAB}bench-engine 7b q8_0 q4_0 (1:128:128)"
    echo "prefill 512 / 2048 tokens${TAB}llama-bench, pp512 / pp2048${TAB}bench-engine 7b (1:2048:2); FL_RUNS=1:512:2"
    echo "decode 16 / 64 sequences, prompt 1024${TAB}llama-batched-bench${TAB}bench-engine 7b (16:1024:64, 64:1024:64)"
    echo "one kernel (MUL_MAT, FLASH_ATTN_EXT, SOFT_MAX ...)${TAB}test-backend-ops perf${TAB}bench-ops NAME, compare-torch FILTER"; } | show_table
}

t_floor() {
  local rf="$B/bin/read_floor" src nvcc copy rows=()
  copy=$("$B/bin/optable" no_such_case 2>/dev/null | sed -nE 's/.*"key":"copy".*"gbps":([0-9.]+).*/\1/p')
  echo "device copy (optable, 1 GiB, read + write): ${copy:-?} GB/s"; rows+=("device-to-device copy, 1 GiB (optable)$TAB${copy:-?} GB/s")
  if [ ! -x "$rf" ]; then
    src="$B/read_floor.cu"; [ -f "$src" ] || src="$HERE/read_floor.cu"
    nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
    "$nvcc" -O3 -arch=sm_90a -o "$LOGS/read_floor" "$src" && rf="$LOGS/read_floor"
  fi
  if [ -x "$rf" ]; then
    "$rf" | tee "$LOGS/read_floor.log"
    mapfile -t -O "${#rows[@]}" rows < <(awk -v T="$TAB" '$1 ~ /^[0-9]+$/ && NF >= 11 {
      printf "read-only, %s bytes%s%s us read (%s GB/s; %s x %s x %s), copy %s us\n", $1, T, $4, $5, $7, $9, $11, $2 }' "$LOGS/read_floor.log")
  fi
  python3 - <<'PY' 2>&1 | tee "$LOGS/gemm_peak.log"
import torch
n = 4096
def rate(fn):  # 2 n^3 / median of 7 batches of 20 calls, after a warm-up
    s, e, ts = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), []
    for k in range(8):
        s.record(); [fn() for _ in range(20)]; e.record(); e.synchronize(); ts += [s.elapsed_time(e) / 20] * (k > 0)
    return 2 * n ** 3 / sorted(ts)[3] / 1e9
a, b = (torch.randn(n, n, device="cuda", dtype=torch.half) for _ in range(2))
print(f"cuBLAS f16 GEMM {n}^3 (torch.matmul): {rate(lambda: a @ b):.0f} TFLOP/s")
i, j = (torch.randint(-127, 127, (n, n), device="cuda", dtype=torch.int8) for _ in range(2))
print(f"cuBLAS int8 GEMM {n}^3 (torch._int_mm): {rate(lambda: torch._int_mm(i, j)):.0f} TOP/s")
PY
  mapfile -t -O "${#rows[@]}" rows < <(sed -nE "s/^(cuBLAS [^:]+): (.*)/\1${TAB}\2/p" "$LOGS/gemm_peak.log")
  { echo "floor${TAB}figure"; printf '%s\n' "${rows[@]}"; } | show_table
}

t_ab() {
  [ $# -ge 3 ] || { echo "usage: run.sh ab BUNDLE_A BUNDLE_B [-n N] -- CMD..." >&2; return 2; }
  local a b n=3 i side dir rc
  a="$(cd "$1" && pwd)" && b="$(cd "$2" && pwd)" || return 2; shift 2
  [ "${1:-}" = "-n" ] && { n=$2; shift 2; }
  [ "${1:-}" = "--" ] && shift
  rm -f "$LOGS"/ab-[AB]-*.log
  for i in $(seq "$n"); do for side in A B; do
    dir=$a; [ "$side" = B ] && dir=$b
    (cd "$dir" && FL_BUNDLE="$dir" timeout "${FL_AB_TIMEOUT:-300}" "$@") > "$LOGS/ab-$side-$i.log" 2>&1
    rc=$?; echo "round $i $side: rc=$rc $(ab_parse one "$LOGS/ab-$side-$i.log")"
  done; done
  echo "A = $a"; echo "B = $b"; ab_parse table "$LOGS"
}

# ab_parse one LOG | table DIR: the figures of a log (fl bench tokens/s, optable and gemv summary
# times, criterion medians), or the median of each over the ab-A-* / ab-B-* logs side by side.
ab_parse() {
  python3 - "$@" <<'PY'
import glob, json, re, statistics, sys
UNIT = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}
def as_json(s):
    try:
        return json.loads(s)
    except ValueError:
        return {}
def figures(path):
    out, run, quant, name = {}, "", "", ""
    for line in open(path, errors="replace"):
        s = line.strip()
        if s.startswith("{"):
            j = as_json(s)
            if "decode_tokens_per_s" in j:
                r = f"{j['batch']}x{j['prompt_len']}:{j['gen_len']} {j.get('quant', 'none')}"
                out[f"fl bench {r} decode tok/s"] = j["decode_tokens_per_s"]
                out[f"fl bench {r} prefill tok/s"] = j["prefill_tokens_per_s"]
            elif "key" in j and "us" in j:
                out[f"{j['key']} us"] = j["us"]
            continue
        if m := re.search(r"--quant ([^,\s]+),", s):
            quant = m[1]
        if m := re.match(r"batch (\d+), prompt (\d+), generate (\d+)", s):
            run = f"{m[1]}x{m[2]}:{m[3]} {quant or 'none'}"
        elif (m := re.match(r"(prefill|decode):.*?([\d.]+) tokens/s", s)) and run:
            out[f"fl bench {run} {m[1]} tok/s"] = float(m[2])
        elif m := re.match(r"(\S+ \d+x\d+ m=\d+ +\S+) +([\d.]+) us", s):
            out[re.sub(r" +", " ", m[1]) + " us"] = float(m[2])
        elif m := re.match(r"(\S.*?): .*?([\d.]+) (TFLOP/s|TOPS)", s):
            out[f"{m[1]} {m[3]}"] = float(m[2])
        elif m := re.match(r"(\S*)\s*time:\s*\[\S+ \S+ ([\d.]+) (\S+)", s):
            out[f"{m[1] or name} us"] = float(m[2]) * UNIT.get(m[3], float("nan"))
        elif line[:1] not in (" ", "") and not s.startswith(("Benchmarking", "Found", "Warn", "Perf", "No change", "Change")):
            name = s.split()[0]
    return out
if sys.argv[1] == "one":
    print(" ".join(f"{k}={v:g}" for k, v in list(figures(sys.argv[2]).items())[:8]))
    sys.exit()
side = {x: [figures(p) for p in sorted(glob.glob(f"{sys.argv[2]}/ab-{x}-*.log"))] for x in "AB"}
keys = list(dict.fromkeys(k for x in "AB" for f in side[x] for k in f))
print("\n| figure | A (median) | B (median) | B / A | runs A, B |\n|---|---|---|---|---|")
for k in keys:
    v = {x: [f[k] for f in side[x] if k in f] for x in "AB"}
    m = {x: statistics.median(v[x]) if v[x] else None for x in "AB"}
    ratio = f"{m['B'] / m['A']:.3f}" if m["A"] and m["B"] else "-"
    fmt = lambda y: "-" if y is None else f"{y:.2f}"
    print(f"| {k.replace('|', '/')} | {fmt(m['A'])} | {fmt(m['B'])} | {ratio} | {len(v['A'])}, {len(v['B'])} |")
PY
}

target=$1; shift
case "$target" in
  tests) t_tests "$@" ;;
  memcheck) t_memcheck "$@" ;;
  bench-ops) t_bench_ops "$@" ;;
  bench-engine) t_bench_engine "$@" ;;
  compare-torch) t_compare_torch "$@" ;;
  compare-llamacpp) t_compare_llamacpp ;;
  floor) t_floor ;;
  tp) t_tp "$@" ;;
  serve-load) t_serve_load "$@" ;;
  serve-compare) t_serve_compare "$@" ;;
  soak) t_soak "$@" ;;
  soak-start) t_soak_start "$@" ;;
  soak-collect) t_soak_collect "$@" ;;
  serve-stress) t_serve_stress "$@" ;;
  serve-check) t_serve_check "$@" ;;
  step-profile) t_step_profile "$@" ;;
  gguf-compare) t_gguf_compare "$@" ;;
  trace) t_trace "$@" ;;
  ab) t_ab "$@" ;;
  *) echo "run.sh: unknown target '$target' (bash run.sh help)" >&2; exit 2 ;;
esac
