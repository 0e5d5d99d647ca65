#!/usr/bin/env bash
# ctest's entry for the constrained-output validity check:
# tests/grammar/run.sh KVRUN [validity.py options]
# jsonschema from the venv scripts/fetch-openai-client.sh makes (KVRUN_VENV),
# SmolLM2 from the model cache (KVRUN_MODEL_CACHE, scripts/fetch-real-models.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kvrun=$1
shift
venv=${KVRUN_VENV:-$HOME/.cache/kvrun-venv}
cache=${KVRUN_MODEL_CACHE:-$HOME/.cache/kvrun-models}
if [ ! -x "$venv/bin/python" ]; then
  echo "grammar validity: no venv in $venv (run scripts/fetch-openai-client.sh, or make test)" >&2
  exit 1
fi
exec "$venv/bin/python" "$here/validity.py" --kvrun "$kvrun" --model "$cache/smollm2-135m-Q4_1.gguf" "$@"
