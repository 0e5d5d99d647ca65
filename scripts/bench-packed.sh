#!/usr/bin/env bash
# Packed weights (ggml-like/kernels.h, src/model/packed_weights.h) against the
# plain rows, side by side: for each model and each ISA table, `kvrun bench`
# with the matrices packed at load (the default) and with KVRUN_PACK=0 (the
# one-token dot products and the per-batch panels of the integer GEMM), one
# after the other, so drift on the machine falls on both alike. Batches of
# 1 to 16 tokens are the decode passes of `kvrun batch` (and speculative
# verification); pp256 a prompt; tg64 generation.
#
# Usage: scripts/bench-packed.sh MODEL.gguf...
#   env: ISAS ("avx512 avxvnni avx2": tables this CPU has), THREADS (2), REPS (3),
#        PPS ("1,2,4,8,16,256"), TG (64)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 MODEL.gguf..." >&2; exit 2; }
isas=${ISAS:-avx512 avxvnni avx2} threads=${THREADS:-2} reps=${REPS:-3}
pps=${PPS:-1,2,4,8,16,256} tg=${TG:-64}
[ -x ./kvrun ] || make build >/dev/null

# "test rate" pairs from a kvrun bench markdown table on stdin.
rates() { awk -F'|' 'NF > 4 && $(NF-2) ~ /(pp|tg)[0-9]/ { t = $(NF-2); gsub(/ /, "", t); split($(NF-1), v, "±"); gsub(/ /, "", v[1]); print t, v[1] }'; }

echo "kvrun: $(./kvrun --version 2>&1 | head -1)"
echo
echo "| model | table | test | packed tok/s | plain tok/s | × |"
echo "| --- | --- | --- | ---: | ---: | ---: |"
for m in "$@"; do
  for isa in $isas; do
    args=(-m "$m" -p "$pps" -n "$tg" -t "$threads" -r "$reps")
    packed=$(KVRUN_ISA=$isa ./kvrun bench "${args[@]}" 2>/dev/null | rates)
    plain=$(KVRUN_ISA=$isa KVRUN_PACK=0 ./kvrun bench "${args[@]}" 2>/dev/null | rates)
    join <(sort <<<"$packed") <(sort <<<"$plain") | sort -k1,1V |
      while read -r test a b; do
        printf '| %s | %s | %s | %s | %s | %s |\n' "$(basename "$m" .gguf)" "$isa" "$test" "$a" "$b" \
          "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')"
      done
  done
done
