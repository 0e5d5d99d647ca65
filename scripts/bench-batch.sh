#!/usr/bin/env bash
# Many sequences at once against the reference engine's llama-batched-bench,
# side by side: for each model and each number of parallel sequences N,
# `kvrun batch` (N requests of a PP-token prompt, TG tokens each, --parallel N)
# and `llama-batched-bench -npp PP -ntg TG -npl N` run one after the other
# with the same threads, so drift on the machine falls on both alike. The
# figure is the aggregate generation rate: tokens of the decode passes over
# their seconds (kvrun's summary line; the reference's S_TG).
#
# The reference is a benchmark only, built outside this repository from the
# llama-cpp-python sdist on PyPI (docs/performance.md); point
# LLAMA_BATCHED_BENCH at its llama-batched-bench.
#
# Usage: LLAMA_BATCHED_BENCH=/path/to/llama-batched-bench scripts/bench-batch.sh MODEL.gguf...
#   env: PP (128), TG (128), THREADS (2), NPL ("1 2 4 8 16")
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BATCHED_BENCH:?set LLAMA_BATCHED_BENCH to llama-batched-bench of the reference engine}"
[ $# -gt 0 ] || { echo "usage: LLAMA_BATCHED_BENCH=... $0 MODEL.gguf..." >&2; exit 2; }
pp=${PP:-128} tg=${TG:-128} threads=${THREADS:-2} npl=${NPL:-1 2 4 8 16}
[ -x ./kvrun ] || make build >/dev/null
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "?"; else printf "%.2f", a / b }'; }
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

# N distinct requests whose prompts are PP tokens (the longest run of words
# that tokenizes to at most PP, found by bisection), TG tokens each.
requests() { # model n
  python3 - "$1" "$2" "$pp" "$tg" <<'PY'
import json, subprocess, sys
model, n, pp, tg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
words = "the quick brown fox jumps over the lazy dog".split()
def text(i, k):
    return " ".join(words[(i + j) % len(words)] + str(j % 7) for j in range(k))
def count(t):
    out = subprocess.run(["./kvrun", "tokenize", "-m", model, "-p", t, "--json"],
                         capture_output=True, text=True, check=True).stdout
    return len(json.loads(out))
for i in range(n):
    lo, hi = 1, pp
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text(i, mid)) <= pp: lo = mid
        else: hi = mid - 1
    print(json.dumps({"id": i, "prompt": text(i, lo), "max_tokens": tg, "temperature": 0,
                      "ignore_eos": True}))
PY
}

echo "kvrun: $(./kvrun --version 2>&1 | head -1)"
echo "reference: $LLAMA_BATCHED_BENCH"
echo
echo "| model | sequences | kvrun tg tok/s | reference S_TG tok/s | × |"
echo "| --- | ---: | ---: | ---: | ---: |"
for m in "$@"; do
  for n in $npl; do
    requests "$m" "$n" >"$tmp"
    ours=$(./kvrun batch -m "$m" -f "$tmp" --parallel "$n" -t "$threads" -c $((pp + tg + 64)) 2>&1 >/dev/null |
      sed -n 's/.*decode passes \([0-9.]*\) tok\/s.*/\1/p')
    theirs=$("$LLAMA_BATCHED_BENCH" -m "$m" -c $(((pp + tg) * n + 64)) -b 2048 -ub 512 -npp "$pp" -ntg "$tg" \
      -npl "$n" -t "$threads" 2>/dev/null | awk -F'|' 'NF > 8 && $2 ~ /[0-9]/ { gsub(/ /, "", $(NF-3)); v = $(NF-3) } END { print v }')
    printf '| %s | %s | %s | %s | %s |\n' "$(basename "$m" .gguf)" "$n" "$ours" "$theirs" "$(ratio "$ours" "$theirs")"
  done
done
