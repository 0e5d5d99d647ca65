#!/usr/bin/env bash
# KV cache quality table: perplexity of a model on a text for K/V cache type
# pairs, with and without rotated keys (--k-rotate), and the cache bytes per
# token. Usage:
#   scripts/kv-quality.sh [MODEL] [TEXT] [CTX]
# (defaults: ../shared/models/stories260K.gguf, ../shared/text/stories260K-samples.txt, 512)
# The pairs: every K type with every V type of f16, q8_0 and q4_0 would be 9
# (18 rotated and not); rotation changes nothing for float keys (one check
# row), so the table keeps the rows that tell something. With q4_0 values,
# --k-rotate rotates the values too (docs/kv-cache.md, "Rotated values").
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-../shared/models/stories260K.gguf}
text=${2:-../shared/text/stories260K-samples.txt}
ctx=${3:-512}
[ -x ./kvrun ] || make build >/dev/null
echo "| K / V cache | keys rotated | bytes per token | PPL (-c $ctx) | vs f16/f16 |"
echo "| --- | --- | ---: | ---: | ---: |"
base=""
for row in f16/f16 f16/f16/r q8_0/q8_0 q8_0/q8_0/r q8_0/q4_0 q8_0/q4_0/r f16/q4_0 q4_0/f16 q4_0/f16/r \
           q4_0/q8_0/r q4_0/q4_0 q4_0/q4_0/r; do
  IFS=/ read -r k v r <<<"$row"
  rot=(); [ -z "$r" ] || rot=(--k-rotate)
  ppl=$(./kvrun perplexity -m "$model" -f "$text" -c "$ctx" --ctk "$k" --ctv "$v" "${rot[@]}" --json </dev/null |
        sed -E 's/.*"ppl": ([0-9.]+).*/\1/')
  bpt=$(./kvrun info -m "$model" --ctk "$k" --ctv "$v" --json </dev/null | sed -nE 's/.*"bytes_per_token": ([0-9]+).*/\1/p')
  [ -n "$base" ] || base=$ppl
  rel=$(awk -v a="$ppl" -v b="$base" 'BEGIN { d = (a / b - 1) * 100; printf (d < 0 ? "−%.2f%%" : "+%.2f%%"), (d < 0 ? -d : d) }')
  [ "$row" != f16/f16 ] || rel="—"
  printf '| %s / %s | %s | %s | %.4f | %s |\n' "$k" "$v" "${r:+yes}" "$bpt" "$ppl" "$rel"
done
