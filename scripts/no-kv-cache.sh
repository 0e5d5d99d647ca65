#!/usr/bin/env bash
# What the KV cache buys: generation speed with and without it (--no-kv-cache
# recomputes the whole sequence for every token) at several lengths.
# Usage: scripts/no-kv-cache.sh [MODEL] [LENGTHS...]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-../shared/models/synthetic/tiny-Q8_0.gguf}
shift || true
lengths=("${@:-32 64 128 256}")
[ -x ./kvrun ] || make build >/dev/null
rate() { sed -nE 's/.*generated ([0-9]+) tok, ([0-9.]+) tok\/s.*/\2/p'; }
echo "| generated tokens | with cache tok/s | --no-kv-cache tok/s | ratio |"
echo "| ---: | ---: | ---: | ---: |"
for n in ${lengths[*]}; do
  with=$(./kvrun -m "$model" -p "Once upon a time" -n "$n" --temp 0 --ignore-eos 2>&1 >/dev/null | rate)
  without=$(./kvrun -m "$model" -p "Once upon a time" -n "$n" --temp 0 --ignore-eos --no-kv-cache 2>&1 >/dev/null | rate)
  ratio=$(awk -v a="$with" -v b="$without" 'BEGIN { printf "%.1f×", a / b }')
  echo "| $n | $with | $without | $ratio |"
done
