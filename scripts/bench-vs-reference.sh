#!/usr/bin/env bash
# kvrun against the reference engine's llama-bench, side by side: for each
# model, `kvrun bench` and `llama-bench` run one after the other with the same
# arguments (-p PP -n TG -t THREADS -r REPS), so drift on the machine falls on
# both alike, and the table gives both rates and their ratio.
#
# The reference is a benchmark only, built outside this repository from the
# llama-cpp-python sdist on PyPI (docs/performance.md says how); point
# LLAMA_BENCH at its llama-bench. For kvrun's AVX2 table against an AVX2 build
# of the reference, run with KVRUN_ISA=avx2 and that build's llama-bench.
#
# Usage: LLAMA_BENCH=/path/to/llama-bench scripts/bench-vs-reference.sh MODEL.gguf...
#   env: PP (256), TG (64), THREADS (2), REPS (3)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench of the reference engine}"
[ $# -gt 0 ] || { echo "usage: LLAMA_BENCH=... $0 MODEL.gguf..." >&2; exit 2; }
pp=${PP:-256} tg=${TG:-64} threads=${THREADS:-2} reps=${REPS:-3}
[ -x ./kvrun ] || make build >/dev/null

# The mean tok/s of test NAME (pp256, tg64) in a markdown table on stdin:
# the last column of its row, before the ±.
rate() { awk -F'|' -v t="$1" 'NF < 4 { next } { gsub(/ /, "", $(NF-2)) } $(NF-2) == t { split($(NF-1), v, "±"); gsub(/ /, "", v[1]); print v[1] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "?"; else printf "%.2f", a / b }'; }

args=(-p "$pp" -n "$tg" -t "$threads" -r "$reps")
echo "kvrun: $(./kvrun --version 2>&1 | head -1)"
echo "reference: $LLAMA_BENCH"
echo
echo "| model | kvrun pp$pp | reference pp$pp | × | kvrun tg$tg | reference tg$tg | × |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for m in "$@"; do
  ours=$(./kvrun bench -m "$m" "${args[@]}" 2>/dev/null)
  theirs=$("$LLAMA_BENCH" -m "$m" "${args[@]}" 2>/dev/null)
  kp=$(rate "pp$pp" <<<"$ours") rp=$(rate "pp$pp" <<<"$theirs")
  kt=$(rate "tg$tg" <<<"$ours") rt=$(rate "tg$tg" <<<"$theirs")
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$(basename "$m" .gguf)" \
    "$kp" "$rp" "$(ratio "$kp" "$rp")" "$kt" "$rt" "$(ratio "$kt" "$rt")"
done
