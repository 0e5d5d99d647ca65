#!/usr/bin/env bash
# Download a recommended model into models/ (for users with internet access;
# kvrun's tests never download anything). Usage: scripts/download-model.sh NAME
# Run without NAME to list what it knows. Checks size and sha256 where pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models

# name | url | file | bytes | sha256 (empty = not pinned: checked only that it is a GGUF file)
MODELS=(
  "stories260K|https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf|stories260K.gguf|1185376|270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d"
  "qwen2.5-0.5b|https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF/resolve/main/qwen2.5-0.5b-instruct-q4_k_m.gguf|qwen2.5-0.5b-instruct-q4_k_m.gguf||"
  "smollm2-360m|https://huggingface.co/HuggingFaceTB/SmolLM2-360M-Instruct-GGUF/resolve/main/smollm2-360m-instruct-q8_0.gguf|smollm2-360m-instruct-q8_0.gguf||"
  "llama-3.2-1b|https://huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF/resolve/main/Llama-3.2-1B-Instruct-Q4_K_M.gguf|Llama-3.2-1B-Instruct-Q4_K_M.gguf||"
  "tinyllama-1.1b|https://huggingface.co/TheBloke/TinyLlama-1.1B-Chat-v1.0-GGUF/resolve/main/tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf|tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf||"
  "mistral-7b|https://huggingface.co/TheBloke/Mistral-7B-Instruct-v0.2-GGUF/resolve/main/mistral-7b-instruct-v0.2.Q4_K_M.gguf|mistral-7b-instruct-v0.2.Q4_K_M.gguf||"
  "gemma-3-270m|https://huggingface.co/unsloth/gemma-3-270m-it-GGUF/resolve/main/gemma-3-270m-it-Q8_0.gguf|gemma-3-270m-it-Q8_0.gguf||"
  "gemma-3-1b|https://huggingface.co/unsloth/gemma-3-1b-it-GGUF/resolve/main/gemma-3-1b-it-Q4_K_M.gguf|gemma-3-1b-it-Q4_K_M.gguf||"
  "gemma-3-4b|https://huggingface.co/unsloth/gemma-3-4b-it-GGUF/resolve/main/gemma-3-4b-it-Q4_K_M.gguf|gemma-3-4b-it-Q4_K_M.gguf||"
  "qwen3-0.6b|https://huggingface.co/Qwen/Qwen3-0.6B-GGUF/resolve/main/Qwen3-0.6B-Q8_0.gguf|Qwen3-0.6B-Q8_0.gguf||"
  "qwen3-1.7b|https://huggingface.co/Qwen/Qwen3-1.7B-GGUF/resolve/main/Qwen3-1.7B-Q8_0.gguf|Qwen3-1.7B-Q8_0.gguf||"
  "qwen3-4b|https://huggingface.co/Qwen/Qwen3-4B-GGUF/resolve/main/Qwen3-4B-Q4_K_M.gguf|Qwen3-4B-Q4_K_M.gguf||"
  "phi-3-mini-4k|https://huggingface.co/microsoft/Phi-3-mini-4k-instruct-gguf/resolve/main/Phi-3-mini-4k-instruct-q4.gguf|Phi-3-mini-4k-instruct-q4.gguf||"
  "phi-4-mini|https://huggingface.co/bartowski/microsoft_Phi-4-mini-instruct-GGUF/resolve/main/microsoft_Phi-4-mini-instruct-Q4_K_M.gguf|microsoft_Phi-4-mini-instruct-Q4_K_M.gguf||"
)

list() {
  echo "models this script knows (scripts/download-model.sh NAME):"
  for m in "${MODELS[@]}"; do IFS='|' read -r n _ f b _ <<<"$m"; printf '  %-16s %s %s\n' "$n" "$f" "${b:+($b bytes)}"; done
}

[ $# -ge 1 ] || { list; exit 0; }
for m in "${MODELS[@]}"; do
  IFS='|' read -r name url file bytes sha <<<"$m"
  [ "$name" = "$1" ] || continue
  out="models/$file"
  if [ -f "$out" ]; then echo "$out already present"; exit 0; fi
  echo "downloading $url -> $out" >&2
  if command -v curl >/dev/null; then curl -fL --retry 3 -o "$out.part" "$url"
  else wget -O "$out.part" "$url"; fi
  got=$(stat -c %s "$out.part")
  if [ -n "$bytes" ]; then
    [ "$got" = "$bytes" ] || { echo "size mismatch: got $got, want $bytes" >&2; rm -f "$out.part"; exit 1; }
  fi
  [ "$(head -c 4 "$out.part")" = "GGUF" ] || { echo "not a GGUF file" >&2; rm -f "$out.part"; exit 1; }
  if [ -n "$sha" ]; then
    echo "$sha  $out.part" | sha256sum -c --quiet - || { echo "sha256 mismatch" >&2; rm -f "$out.part"; exit 1; }
  fi
  mv "$out.part" "$out"
  echo "$out"
  exit 0
done
echo "unknown model '$1'" >&2; list >&2; exit 2
