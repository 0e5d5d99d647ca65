#!/usr/bin/env bash
# ctest's entry for the kvrun serve tests: tests/serve/run.sh KVRUN [--quick]
# The openai client from the venv scripts/fetch-openai-client.sh makes
# (KVRUN_VENV), SmolLM2 from the model cache (KVRUN_MODEL_CACHE,
# scripts/fetch-real-models.sh), stories260K from ../shared.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kvrun=$1
shift
venv=${KVRUN_VENV:-$HOME/.cache/kvrun-venv}
cache=${KVRUN_MODEL_CACHE:-$HOME/.cache/kvrun-models}
shared=$(cd "$here/../../../shared" && pwd)
if [ ! -x "$venv/bin/python" ]; then
  echo "serve tests: no openai client in $venv (run scripts/fetch-openai-client.sh, or make test)" >&2
  exit 1
fi
exec "$venv/bin/python" "$here/test_serve.py" --kvrun "$kvrun" \
  --chat-model "$cache/smollm2-135m-Q4_1.gguf" --tiny-model "$shared/models/stories260K.gguf" "$@"
