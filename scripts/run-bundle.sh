#!/usr/bin/env bash
# Runs a bundle made by scripts/bundle.sh on a GPU machine. Every test binary runs with
# FL_REQUIRE_GPU=1 (a missing GPU is a failure). The last line is "N passed, N failed".
#   bash run-bundle.sh [--bench [NAME]]   also run the criterion benches (those whose file
#                                         name contains NAME, e.g. `norm`; default all)
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
export FL_REQUIRE_GPU=1
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
passed=0; failed=0
for t in "$HERE"/tests/*; do
  [ -x "$t" ] || continue
  name="$(basename "$t")"
  log="$(mktemp)"
  timeout "${FL_TEST_TIMEOUT:-300}" "$t" --test-threads=4 >"$log" 2>&1
  rc=$?
  p=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\1/' | awk '{s+=$1} END {print s+0}')
  f=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\2/' | awk '{s+=$1} END {print s+0}')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or timed out before reporting
  [ "$rc" -eq 124 ] && echo "TIMEOUT $name after ${FL_TEST_TIMEOUT:-300}s"
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$rc" -ne 0 ]; then
    echo "FAIL $name (exit $rc)"; grep -vE '^test .* ok$' "$log" | tail -40
  else
    echo "ok   $name: $p passed"
  fi
  rm -f "$log"
done
if [ "${1:-}" = "--bench" ]; then
  for b in "$HERE"/benches/*; do
    [ -x "$b" ] || continue
    case "$(basename "$b")" in *"${2:-}"*) ;; *) continue ;; esac
    echo "== bench $(basename "$b")"
    "$b" --bench 2>&1 | grep -vE '^(Gnuplot|Benchmarking|Found|  [0-9]+ \(|Warning|$)' || true
  done
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
