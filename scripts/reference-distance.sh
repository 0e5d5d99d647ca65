#!/usr/bin/env bash
# How far the reference engine's own quantized CPU path lands from each
# golden file (the bar kvrun's default mode is held to, docs/performance.md
# "Prompt precision"): builds scripts/reference/golden_distance.cpp against a
# llama.cpp build outside this repository (the llama-cpp-python sdist's
# vendor/llama.cpp, built with cmake as for llama-bench) and runs it on every
# golden of the given directories whose model file is in one of the MODELS
# directories (colon-separated; default the real models' cache and
# ../shared/models with its subfolders).
# Usage: LLAMA_CPP=/path/to/llama.cpp [MODELS=dir:dir...] \
#          scripts/reference-distance.sh [GOLDEN_DIR...]   (default ../shared/golden-real)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_CPP:?set LLAMA_CPP to the reference engine source tree (with build/bin)}"
IFS=: read -r -a models <<<"${MODELS:-$HOME/.cache/kvrun-models:../shared/models:../shared/models/synthetic:../shared/models/families:../shared/models/next}"
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=(../shared/golden-real)
out=${TMPDIR:-/tmp}/kvrun-golden-distance
g++ -O2 -std=c++17 scripts/reference/golden_distance.cpp -I"$LLAMA_CPP/include" \
  -I"$LLAMA_CPP/ggml/include" -L"$LLAMA_CPP/build/bin" -lllama -lggml -lggml-base \
  -Wl,-rpath,"$LLAMA_CPP/build/bin" -o "$out"
for d in "${dirs[@]}"; do
  for f in "$d"/*.json; do
    model=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"])' "$f")
    found=
    for m in "${models[@]}"; do [ -f "$m/$model" ] && found=$m/$model && break; done
    if [ -n "$found" ]; then "$out" "$found" "$f"; else echo "$f: $model not found" >&2; fi
  done
done
