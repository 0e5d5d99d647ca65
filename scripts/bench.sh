#!/usr/bin/env bash
# The standard CPU benchmark table: random-weight models with TinyLlama-1.1B
# shapes (made on demand with `kvrun synth`, never committed) in Q4_0, Q8_0
# and Q4_K_M, prompt 256 and generate 64, with the roofline (bytes read per
# generated token, fraction of this machine's read bandwidth), generation at
# depth 4096 against depth 0, and peak RSS; with --profile, where each
# generated token's time goes (per weight matrix, attention, the rest), and
# (--matrices) how fast the token's weight matrices stream when only read and
# when multiplied, through the same parallel loops.
# Usage: scripts/bench.sh [THREADS] [REPS]   (models cached in $KVRUN_BENCH_DIR, default /tmp/kvrun-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
reps=${2:-3}
dir=${KVRUN_BENCH_DIR:-/tmp/kvrun-bench}
vocab=${KVRUN_VOCAB:-../shared/vocab/ggml-vocab-llama-spm.gguf}
mkdir -p "$dir"
[ -x ./kvrun ] || make build >/dev/null
models=()
for t in q4_0 q8_0 q4_k_m; do
  f="$dir/tinyllama-1.1b-$t.gguf"
  if [ ! -f "$f" ]; then
    if [ "$t" = q4_k_m ]; then
      [ -f "$dir/tinyllama-1.1b-f16.gguf" ] || ./kvrun synth --preset tinyllama-1.1b --type f16 --vocab "$vocab" -o "$dir/tinyllama-1.1b-f16.gguf"
      ./kvrun quantize "$dir/tinyllama-1.1b-f16.gguf" "$f" Q4_K_M
    else
      ./kvrun synth --preset tinyllama-1.1b --type "$t" --vocab "$vocab" -o "$f"
    fi
  fi
  models+=(-m "$f")
done
./kvrun bench "${models[@]}" -p 256 -n 64 -t "$threads" -r "$reps" --roofline --matrices --profile
echo
echo "generation with 4096 tokens already in the (F16) cache, against an empty cache:"
./kvrun bench "${models[@]}" -p 0 -n 32 -d 0,4096 -t "$threads" -r "$reps" --profile |
  awk -F'|' '
    { print }
    $3 ~ /tg[0-9]+ *$/ { gsub(/ /, "", $2); split($5, v, " "); d0[$2] = v[1] }
    $3 ~ /@d4096/ { gsub(/ /, "", $2); split($5, v, " "); d4[$2] = v[1] }
    END { for (m in d4) if (d0[m] > 0) printf "  %s: tg@d4096 / tg@d0 = %.0f%%\n", m, 100 * d4[m] / d0[m] }'
echo
echo "peak RSS (generate 64 after a 256-token prompt):"
for t in q4_0 q8_0 q4_k_m; do
  f="$dir/tinyllama-1.1b-$t.gguf"
  rss=$(./kvrun -m "$f" -p "$(printf 'hello %.0s' $(seq 1 250))" -n 64 --ignore-eos --temp 0 -t "$threads" 2>&1 >/dev/null | sed -nE 's/.*peak RSS ([0-9.]+ [KMG]iB).*/\1/p')
  echo "  $t: file $(du -h "$f" | cut -f1), peak RSS $rss"
done
