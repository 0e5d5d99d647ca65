#!/usr/bin/env bash
# KV cache quality table: perplexity of a model on a text for each K/V cache
# type pair, with the cache bytes per token. Usage:
#   scripts/kv-quality.sh [MODEL] [TEXT] [CTX]
# (defaults: ../shared/models/stories260K.gguf, ../shared/text/stories260K-samples.txt, 256)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-../shared/models/stories260K.gguf}
text=${2:-../shared/text/stories260K-samples.txt}
ctx=${3:-256}
[ -x ./kvrun ] || make build >/dev/null
echo "| K / V cache | bytes per token | PPL (-c $ctx) | vs f16/f16 |"
echo "| --- | ---: | ---: | ---: |"
base=""
for pair in f16/f16 q8_0/q8_0 q8_0/q4_0 q4_0/q4_0 f32/f32; do
  k=${pair%/*}; v=${pair#*/}
  ppl=$(./kvrun perplexity -m "$model" -f "$text" -c "$ctx" --ctk "$k" --ctv "$v" --json | sed -E 's/.*"ppl": ([0-9.]+).*/\1/')
  bpt=$(./kvrun info -m "$model" --ctk "$k" --ctv "$v" --json | sed -nE 's/.*"bytes_per_token": ([0-9]+).*/\1/p')
  [ -n "$base" ] || base=$ppl
  rel=$(awk -v a="$ppl" -v b="$base" 'BEGIN { printf "%+.2f%%", (a / b - 1) * 100 }')
  echo "| $k / $v | $bpt | $ppl | $rel |"
done
