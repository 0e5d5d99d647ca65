#!/usr/bin/env bash
# The official `openai` Python client, which the kvrun serve tests drive the
# server with (tests/serve/), in a virtual environment outside the clone
# (KVRUN_VENV, default ~/.cache/kvrun-venv), from PyPI, once. Pinned, so a
# new client release cannot change what the tests check without a commit.
# Exits non-zero when it cannot be had: the serve tests then fail loudly.
set -euo pipefail
venv=${KVRUN_VENV:-$HOME/.cache/kvrun-venv}
want=openai==3.63.0
py=${PYTHON:-python3}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '${want#openai==}')" 2>/dev/null; then
  echo "fetch-openai-client: $want cached in $venv"
  exit 0
fi
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$want"
echo "fetch-openai-client: $want installed in $venv"
