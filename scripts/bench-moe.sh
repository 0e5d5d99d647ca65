#!/usr/bin/env bash
# Mixtures of experts against the reference engine: the Qwen3-30B-A3B and
# Qwen3.5-35B-A3B shapes (`kvrun synth`, Q4_K_M, fewer layers so that each
# fits a 24 GiB machine: 16 of 48 and 12 of 40), written once into
# $KVRUN_BENCH_DIR (~/.cache/kvrun-bench); then pp and tg side by side with
# llama-bench (scripts/bench-vs-reference.sh: alternated per model), the
# weight bytes a generated token reads against the file (`kvrun info`), and
# the peak RSS of two runs beside the file size: a short prompt and 128
# generated tokens, and a story of about 500 tokens and 32. Last, this
# machine's read bandwidth (`kvrun-lab roofline`): a generated token's bytes
# times tg over it is how near the memory roof each engine runs.
# Usage: LLAMA_BENCH=/path/to/llama-bench scripts/bench-moe.sh
#   env: PP (512), TG (128), THREADS (2), REPS (2)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench of the reference engine}"
dir=${KVRUN_BENCH_DIR:-$HOME/.cache/kvrun-bench}
vocabs=${KVRUN_MODEL_CACHE:-$HOME/.cache/kvrun-models}/llama.cpp-vocab
mkdir -p "$dir"
[ -x ./kvrun ] && [ -x ./kvrun-lab ] || make build >/dev/null
[ -f "$vocabs/ggml-vocab-qwen2.gguf" ] || scripts/fetch-real-models.sh >&2
models=()
for spec in "qwen3-30b-a3b:16l:$vocabs/ggml-vocab-qwen2.gguf" \
            "qwen3.5-35b-a3b:12l:../shared/vocab/ggml-vocab-qwen35.gguf"; do
  IFS=: read -r preset layers vocab <<<"$spec"
  m=$dir/$preset-$layers-Q4_K_M.gguf
  [ -f "$m" ] || ./kvrun synth --preset "$preset" --type Q4_K_M --vocab "$vocab" -o "$m" \
    -t "${THREADS:-2}" >&2
  models+=("$m")
done
PP=${PP:-512} TG=${TG:-128} REPS=${REPS:-2} scripts/bench-vs-reference.sh "${models[@]}"
echo
echo "| model | file | weights read per generated token | peak RSS, 4-token prompt + 128 generated | peak RSS, a 2000-character story (about 500 tokens) + 32 |"
echo "| --- | ---: | ---: | ---: | ---: |"
# Peak RSS in KiB of one run (GNU time).
rss() {
  local out
  out=$(mktemp)
  /usr/bin/time -f '%M' -o "$out" ./kvrun "$@" -t "${THREADS:-2}" --temp 0 >/dev/null 2>&1
  tail -1 "$out"
  rm -f "$out"
}
text=$(head -c 2000 ../shared/text/stories260K-samples.txt | tr '\n' ' ')
for m in "${models[@]}"; do
  j=$(./kvrun info -m "$m" --json)
  read -r file per_token < <(python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["file_bytes"], j["weight_bytes_per_token"])' <<<"$j")
  short=$(rss -m "$m" -p "Once upon a time" -n 128)
  long=$(rss -m "$m" -p "$text" -n 32)
  awk -v n="$(basename "$m" .gguf)" -v f="$file" -v t="$per_token" -v s="$short" -v l="$long" \
    'BEGIN { printf "| %s | %.2f GiB | %.0f MiB | %.2f GiB | %.2f GiB |\n", n, f / 2^30, t / 2^20, s / 2^20, l / 2^20 }'
done
echo
./kvrun-lab roofline -t "${THREADS:-2}"
