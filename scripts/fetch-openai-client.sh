#!/usr/bin/env bash
# The official `openai` Python client, which the kvrun serve tests drive the
# server with (tests/serve/), and `jsonschema`, which validates constrained
# answers (tests/grammar/), in a virtual environment outside the clone
# (KVRUN_VENV, default ~/.cache/kvrun-venv), from PyPI, once. Pinned, so a
# new client release cannot change what the tests check without a commit.
# Exits non-zero when it cannot be had: the serve tests then fail loudly.
set -euo pipefail
venv=${KVRUN_VENV:-$HOME/.cache/kvrun-venv}
openai=3.63.0
jsonschema=4.26.0
want="openai==$openai jsonschema==$jsonschema"
py=${PYTHON:-python3}
check="import openai, jsonschema, importlib.metadata as m, sys
sys.exit(openai.__version__ != '$openai' or m.version('jsonschema') != '$jsonschema')"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "fetch-openai-client: $want cached in $venv"
  exit 0
fi
rm -rf "$venv"
"$py" -m venv "$venv"
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install -q --disable-pip-version-check $want
echo "fetch-openai-client: $want installed in $venv"
