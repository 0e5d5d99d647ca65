#!/usr/bin/env bash
# Speculative decoding beside plain generation, in one `kvrun bench` run per
# row (the same process, the same prompt, greedy, the answers checked equal):
#   - --lookup on input-grounded tasks with SmolLM2-135M-Instruct (the real
#     model of scripts/fetch-real-models.sh): copying a paragraph, and
#     rewriting a function with a variable renamed;
#   - a draft model: SmolLM2 requantized to Q8_0 with its Q4_0 copy drafting,
#     and random-weight TinyLlama-1.1B shapes, Q8_0 with its Q4_0 copy
#     (random weights agree on little: the acceptance shows it).
# Usage: scripts/bench-speculative.sh [THREADS] [REPS] [N_GEN]
# Models are made once under ${KVRUN_BENCH_DIR:-$HOME/.cache/kvrun-bench}.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
reps=${2:-3}
n=${3:-128}
dir=${KVRUN_BENCH_DIR:-$HOME/.cache/kvrun-bench}
cache=${KVRUN_MODEL_CACHE:-$HOME/.cache/kvrun-models}
mkdir -p "$dir"
smol="$cache/smollm2-135m-Q4_1.gguf"
[ -f "$smol" ] || scripts/fetch-real-models.sh
for t in Q8_0 Q4_0; do
  [ -f "$dir/smollm2-135m-$t.gguf" ] ||
    ./kvrun quantize --allow-requantize "$smol" "$dir/smollm2-135m-$t.gguf" "$t" >/dev/null
done
vocab=../shared/models/stories260K.gguf
[ -f "$dir/tinyllama-1.1b-f16.gguf" ] ||
  ./kvrun synth --preset tinyllama-1.1b --type f16 --vocab "$vocab" -o "$dir/tinyllama-1.1b-f16.gguf" >/dev/null
for t in Q8_0 Q4_0; do
  [ -f "$dir/tinyllama-1.1b-$t.gguf" ] ||
    ./kvrun quantize "$dir/tinyllama-1.1b-f16.gguf" "$dir/tinyllama-1.1b-$t.gguf" "$t" >/dev/null
done

prompts=$(mktemp -d)
trap 'rm -rf "$prompts"' EXIT
# SmolLM2's chat template, written out (bench reads the file as it is).
cat >"$prompts/quote.txt" <<'TXT'
<|im_start|>user
Copy the following paragraph exactly, word for word.

The lighthouse keeper climbed the spiral stairs every evening at dusk. He carried a small brass lantern, a notebook, and a thermos of strong black tea. At the top he wiped the great lens with a soft cloth, checked the oil, and wrote the time and the weather in his notebook. Ships passing in the night never saw him, but they saw his light, and they knew where the rocks were. In winter the storms came from the north, and the spray reached the windows of the lamp room; in summer the sea was so calm that he could hear the seals on the far rocks.<|im_end|>
<|im_start|>assistant
TXT
cat >"$prompts/rename.txt" <<'TXT'
<|im_start|>user
Copy this Python function exactly, but rename the variable `subtotal` to `running_sum`.

def compute_total(items, tax_rate):
    subtotal = 0
    for item in items:
        price = item["price"] * item["quantity"]
        if item.get("discount"):
            price = price * (1 - item["discount"])
        subtotal += price
    tax = subtotal * tax_rate
    return subtotal + tax<|im_end|>
<|im_start|>assistant
TXT
cat >"$prompts/story.txt" <<'TXT'
Once upon a time, in a small village by the sea, there lived an old fisherman who
TXT

bench() { ./kvrun bench -p 0 -n "$n" -r "$reps" -t "$threads" "$@" </dev/null 2>/dev/null | grep ' after '; }
echo "| model | type | size | params | backend | threads | test | tok/s | drafts accepted |"
echo "| --- | --- | ---: | ---: | --- | ---: | --- | ---: | ---: |"
bench -m "$smol" -f "$prompts/quote.txt" --lookup 10
bench -m "$smol" -f "$prompts/rename.txt" --lookup 10
bench -m "$smol" -f "$prompts/story.txt" --lookup 10
bench -m "$dir/smollm2-135m-Q8_0.gguf" -f "$prompts/quote.txt" --draft-model "$dir/smollm2-135m-Q4_0.gguf"
bench -m "$dir/smollm2-135m-Q8_0.gguf" -f "$prompts/story.txt" --draft-model "$dir/smollm2-135m-Q4_0.gguf"
bench -m "$dir/tinyllama-1.1b-Q8_0.gguf" -f "$prompts/story.txt" --draft-model "$dir/tinyllama-1.1b-Q4_0.gguf"
