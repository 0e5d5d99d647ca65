#!/usr/bin/env bash
# The CUDA backend's checks on a GPU machine, as one prepared run (< 8 min).
#
# Two steps, because the GPU machine has no ../shared and cannot install
# packages:
#
#   1. HERE, on a dev machine with ../shared and apt:
#        scripts/gpu-check.sh prepare [DIR]        (DIR defaults to .gpudata)
#      copies into DIR (inside the repo; added to .git/info/exclude):
#        DIR/vocab/ggml-vocab-llama-spm.gguf   for `kvrun synth`
#        DIR/golden/*.json, DIR/models/...     goldens and the small models they use
#        DIR/deps/                             fmt, CLI11, nlohmann-json, utf8proc, doctest
#                                              as unpacked .debs (headers + .so)
#      about 50 MiB in all: carry DIR with the run (`carry: [".gpudata"]`).
#
#   2. THERE, on the GPU machine, from the repo root:
#        DATA_DIR=.gpudata scripts/gpu-check.sh
#      a. configures and builds with -DKVRUN_CUDA=ON for this GPU's compute
#         capability only (CUDA_ARCH=... overrides), in build-gpu/;
#      b. runs the CUDA tests (kvrun_tests -tc='cuda*'; goldens read from
#         DATA_DIR through KVRUN_SHARED_DIR);
#      c. synthesizes tinyllama-1.1b in q4_0 and q8_0 and prints tokens/s for
#         a 256-token prompt and 64 generated tokens, cpu vs cuda.
#      Any failure stops the script with a non-zero status and a FAILED line.
#      GPU_CHECK_SANITIZE=1 also runs the attention/matmul tests under
#      compute-sanitizer memcheck (slow; not available on every machine).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { printf '\n=== %s\n' "$*"; }
die() {
    printf '\nFAILED: %s\n' "$*" >&2
    exit 1
}
trap 'die "line $LINENO: $BASH_COMMAND"' ERR

# ---------------------------------------------------------------- prepare ----
if [[ "${1:-}" == prepare ]]; then
    dir=${2:-.gpudata}
    shared=$(cd "$root/../shared" && pwd) || die "no ../shared next to the repo"
    mkdir -p "$dir"/{vocab,golden,models/synthetic,deps}
    grep -qxF "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >>.git/info/exclude
    cp "$shared/vocab/ggml-vocab-llama-spm.gguf" "$dir/vocab/"
    cp "$shared"/golden/*.json "$dir/golden/"
    cp "$shared/models/stories260K.gguf" "$dir/models/"
    # The smaller synthetic models (the carry limit is 64 MiB with the tree).
    for m in tiny-Q4_0 tiny-Q4_K_M tiny-Q6_K; do
        cp "$shared/models/synthetic/$m.gguf" "$dir/models/synthetic/"
    done
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download libfmt-dev libfmt9 libcli11-dev nlohmann-json3-dev libutf8proc-dev \
        libutf8proc2 doctest-dev libedit-dev libedit2 libbsd0 libbsd-dev libmd0 >/dev/null) || die "apt-get download of the build dependencies"
    for f in "$tmp"/*.deb; do dpkg -x "$f" "$dir/deps"; done
    rm -rf "$tmp" "$dir/deps/usr/share/doc"
    du -sh "$dir"
    echo "prepared $dir: now run DATA_DIR=$dir scripts/gpu-check.sh on the GPU machine (carry $dir)"
    exit 0
fi

# ---------------------------------------------------------------- check ----
t_start=$(date +%s)
DATA_DIR=$(cd "${DATA_DIR:-$root/.gpudata}" 2>/dev/null && pwd) || die "DATA_DIR (${DATA_DIR:-.gpudata}) not found: run 'scripts/gpu-check.sh prepare' first"
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
export PATH=/usr/local/cuda/bin:$PATH

say "GPU"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: no NVIDIA driver here"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
arch=${CUDA_ARCH:-$cap}
command -v nvcc >/dev/null || die "nvcc not found"
nvcc --version | tail -2

say "configure + build (CUDA arch $arch, $JOBS jobs)"
deps=$DATA_DIR/deps/usr
prefix=()
if [[ -d "$deps" ]]; then
    prefix=(-DCMAKE_PREFIX_PATH="$deps" -DCMAKE_INCLUDE_PATH="$deps/include")
    export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
[[ -f "$BUILD/CMakeCache.txt" ]] || cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKVRUN_CUDA=ON \
    -DCUDA_ARCH="$arch" -DKVRUN_OPENBLAS=OFF "${prefix[@]}" >"$BUILD.configure.log" 2>&1 ||
    {
        tail -30 "$BUILD.configure.log"
        die "cmake configure"
    }
timeout 300 cmake --build "$BUILD" -j "$JOBS" >"$BUILD.build.log" 2>&1 || {
    tail -40 "$BUILD.build.log"
    die "build"
}
if grep -q "warning" "$BUILD.build.log"; then
    echo "build warnings:"
    grep -A3 "warning" "$BUILD.build.log" | head -40
fi
echo "built in $(($(date +%s) - t_start)) s"

say "CUDA tests"
export KVRUN_SHARED_DIR=$DATA_DIR
rc=0
timeout 240 "$BUILD/kvrun_tests" -tc='cuda*' >"$BUILD.cuda-tests.log" 2>&1 || rc=$?
grep -E "MESSAGE|skipped|max \||worst|ERROR|FAILED|test cases|assertions|Status|backend" "$BUILD.cuda-tests.log" |
    grep -v "^=*$" | head -120 || true
if [[ $rc != 0 ]]; then
    tail -80 "$BUILD.cuda-tests.log"
    die "CUDA tests (exit $rc; full log: $BUILD.cuda-tests.log)"
fi
if [[ "${GPU_CHECK_SANITIZE:-0}" == 1 ]]; then
    say "compute-sanitizer memcheck"
    timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/kvrun_tests" \
        -tc='cuda attention*,cuda ops*' || die "compute-sanitizer"
fi

say "benchmark: tinyllama-1.1b, prompt 256 / generate 64"
vocab=$DATA_DIR/vocab/ggml-vocab-llama-spm.gguf
[[ -f "$vocab" ]] || die "no $vocab"
prompt=$(python3 -c "print(' '.join(['the'] * 255))")
rows=()
for type in q4_0 q8_0; do
    model=/tmp/kvrun-tinyllama-$type.gguf
    [[ -f "$model" ]] || timeout 180 ./kvrun synth --preset tinyllama-1.1b --type "$type" --vocab "$vocab" -o "$model" \
        -t "$(nproc)" >/dev/null || die "kvrun synth $type"
    for dev in cpu cuda; do
        out=/tmp/kvrun-bench-$type-$dev
        timeout 120 ./kvrun -m "$model" -p "$prompt" -n 64 -c 512 --temp 0 --ignore-eos --json -v \
            --device "$dev" -t "$(nproc)" >"$out.json" 2>"$out.err" || {
            cat "$out.err"
            die "kvrun --device $dev ($type)"
        }
        # The run must really have used the device asked for (run.cpp must call make_backend).
        grep -q "backend $dev" "$out.err" || {
            grep "backend" "$out.err" || true
            die "kvrun ran without --device $dev taking effect (is src/cli/run.cpp calling make_backend?)"
        }
        rows+=("$(python3 -c "
import json, sys
j = json.load(open('$out.json'))
t = j['timings']
print(f\"| $type | $dev | {j['tokens']['prompt']} | {t['prompt_tok_s']:.1f} | {j['tokens']['generated']} | {t['generation_tok_s']:.1f} | {t['first_token_ms']:.0f} |\")
")")
    done
done
echo
echo "| weights | device | prompt tok | prompt tok/s | generated | gen tok/s | first token ms |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
printf '%s\n' "${rows[@]}"
grep -h "backend" /tmp/kvrun-bench-q4_0-cuda.err | head -1
echo
echo "gpu-check: OK in $(($(date +%s) - t_start)) s"
