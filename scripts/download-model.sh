#!/usr/bin/env bash
# Download a recommended model into models/ (for users with internet access;
# kvrun's tests never download anything). Usage: scripts/download-model.sh NAME
# Run without NAME to list what it knows. Checks size and sha256 where pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models

# name | url | file | bytes | sha256 (empty = not pinned)
MODELS=(
  "stories260K|https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf|stories260K.gguf|1185376|270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d"
)

list() {
  echo "models this script knows (scripts/download-model.sh NAME):"
  for m in "${MODELS[@]}"; do IFS='|' read -r n _ f b _ <<<"$m"; printf '  %-16s %s (%s bytes)\n' "$n" "$f" "$b"; done
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
  [ "$got" = "$bytes" ] || { echo "size mismatch: got $got, want $bytes" >&2; rm -f "$out.part"; exit 1; }
  if [ -n "$sha" ]; then
    echo "$sha  $out.part" | sha256sum -c --quiet - || { echo "sha256 mismatch" >&2; rm -f "$out.part"; exit 1; }
  fi
  mv "$out.part" "$out"
  echo "$out"
  exit 0
done
echo "unknown model '$1'" >&2; list >&2; exit 2
