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
#        DIR/golden-next/, DIR/models/next/    tiny-qwen3moe and its story golden
#        DIR/deps/                             fmt, CLI11, nlohmann-json, utf8proc, doctest
#                                              as unpacked .debs (headers + .so)
#      about 58 MiB in all: carry DIR with the run (`carry: [".gpudata"]`).
#
#   2. THERE, on the GPU machine, from the repo root:
#        DATA_DIR=.gpudata scripts/gpu-check.sh
#      a. configures and builds with -DKVRUN_CUDA=ON for this GPU's compute
#         capability only (CUDA_ARCH=... overrides), in build-gpu/;
#      b. runs the CUDA tests (kvrun_tests -tc='cuda*,coherence*'; goldens
#         read from DATA_DIR through KVRUN_SHARED_DIR), among them CUDA-graph
#         decode vs eager launches (bit for bit) and a forced graph failure;
#      c. synthesizes tinyllama-1.1b in q4_0, q8_0 and (via kvrun quantize)
#         Q4_K_M and prints kvrun bench pp256/tg64 on cuda and cpu, a -ngl 11
#         split, and tg32 at depth 4096 with the whole KV ring on the GPU vs
#         --kv-gpu-window 512 (hot/cold); tg64 with CUDA graphs
#         (default) vs KVRUN_CUDA_GRAPHS=0 for Q4_0 1.1B and stories260K;
#         stories260K tg beside --lookup 8 and a draft model on the GPU;
#      d. prints kvrun info's GPU plan, a hot/cold run's stats line, a run's
#         transfer and graph counts (KVRUN_CUDA_DEBUG=1: a decode step should
#         download only the logits) and chat's /stats GPU line.
#      Any failure stops the script with a non-zero status and a FAILED line
#      (GPU_CHECK_KEEP_GOING=1: once built, every check runs and the failed
#      ones are listed at the end).
#      GPU_CHECK_TESTS_ONLY=1 stops after b (and the sanitizer run): a
#      short device run for a change to the CUDA code or its tests.
#      GPU_CHECK_PROFILE=1 skips the tests and profiles decode instead: the
#      1.1B Q4_0 shape's and stories260K's steps timed and their transfers
#      counted (KVRUN_CUDA_DEBUG=1 with graphs, =2 eager), and kvrun bench
#      pp256/tg64 for Q4_0 and Q8_0.
#      GPU_CHECK_MOE=1 skips the tests and benchmarks the Qwen3-30B-A3B
#      shape (16 layers, Q4_K_M) with its experts on the GPU, --n-cpu-moe 8,
#      --cpu-moe and on the CPU alone (#49's figures beside a GPU).
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
# GPU_CHECK_KEEP_GOING=1: a failed check after the build is noted and the rest
# still run (one device run then reports everything); the exit status is 1 if
# any failed.
failures=()
check_failed() {
    [[ "${GPU_CHECK_KEEP_GOING:-0}" == 1 ]] || die "$*"
    printf '\nFAILED (going on): %s\n' "$*" >&2
    failures+=("$*")
}

# ---------------------------------------------------------------- prepare ----
if [[ "${1:-}" == prepare ]]; then
    dir=${2:-.gpudata}
    shared=$(cd "$root/../shared" && pwd) || die "no ../shared next to the repo"
    mkdir -p "$dir"/{vocab,golden,models/synthetic,deps}
    grep -qxF "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >>.git/info/exclude
    cp "$shared/vocab/ggml-vocab-llama-spm.gguf" "$dir/vocab/"
    cp "$shared"/golden/*.json "$dir/golden/"
    cp "$shared/models/stories260K.gguf" "$dir/models/"
    # A story prompt for the speculative rows (stories260K continues it).
    head -c 1500 "$shared/text/stories260K-samples.txt" >"$dir/prompt-story.txt"
    # The smaller synthetic models (the carry limit is 64 MiB with the tree).
    for m in tiny-Q4_0 tiny-Q4_K_M tiny-Q6_K; do
        cp "$shared/models/synthetic/$m.gguf" "$dir/models/synthetic/"
    done
    # A mixture of experts: the tiny qwen3moe file and its story golden (the
    # CUDA test; 8 MiB of the carry's 64).
    mkdir -p "$dir/models/next" "$dir/golden-next"
    cp "$shared/models/next/tiny-qwen3moe-Q4_K_M.gguf" "$dir/models/next/"
    cp "$shared/golden-next/tiny-qwen3moe-Q4_K_M__story.json" "$dir/golden-next/"
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

# Synthetic TinyLlama-1.1B shapes for the profile and the benchmarks.
vocab=$DATA_DIR/vocab/ggml-vocab-llama-spm.gguf
[[ -f "$vocab" ]] || die "no $vocab"
nt=$(nproc)
# Q4_0 and Q8_0 straight from synth; Q4_K_M through the quantize recipe
# (Q4_K with Q6_K for the output, attn_v and ffn_down where the recipe says).
model_for() {
    local type=$1 m=/tmp/kvrun-tinyllama-$1.gguf
    if [[ ! -f "$m" ]]; then
        if [[ $type == q4_k_m ]]; then
            local f16=/tmp/kvrun-tinyllama-f16.gguf
            [[ -f "$f16" ]] || timeout 180 ./kvrun synth --preset tinyllama-1.1b --type f16 --vocab "$vocab" \
                -o "$f16" -t "$nt" >/dev/null || die "kvrun synth f16"
            timeout 180 ./kvrun quantize "$f16" "$m" Q4_K_M -t "$nt" >/dev/null || die "kvrun quantize Q4_K_M"
            rm -f "$f16"
        else
            timeout 180 ./kvrun synth --preset tinyllama-1.1b --type "$type" --vocab "$vocab" -o "$m" \
                -t "$nt" >/dev/null || die "kvrun synth $type"
        fi
    fi
    echo "$m"
}

if [[ "${GPU_CHECK_PROFILE:-0}" == 1 ]]; then
    say "decode profile: tinyllama-1.1b shape, Q4_0"
    m=$(model_for q4_0)
    # Host and GPU time of a decode step (KVRUN_CUDA_DEBUG=1: with graphs, the
    # recording on the host and the graph on the GPU; =2, eager: each kind
    # of op waited for), and stories260K (where fixed costs show).
    for model in "$m" "$DATA_DIR/models/stories260K.gguf"; do
        for dbg in "1 1" "0 2"; do
            read -r g d <<<"$dbg"
            echo "--- $(basename "$model") KVRUN_CUDA_GRAPHS=$g KVRUN_CUDA_DEBUG=$d"
            KVRUN_CUDA_GRAPHS=$g KVRUN_CUDA_DEBUG=$d timeout 60 ./kvrun -m "$model" -p "the cat" -n 64 \
                -c 1024 --temp 0 --ignore-eos --device cuda </dev/null 2>&1 >/dev/null |
                grep -E "kvrun: CUDA|\[kvrun\]" | sed -E 's/ \| (first token|n_ctx|KV|peak|stop)[^|]*//g' || true
        done
    done
    q8=$(model_for q8_0)
    for model in "$m" "$q8"; do
        timeout 120 ./kvrun bench -m "$model" -p 256 -n 64 -r 3 --device cuda </dev/null 2>/dev/null | grep -E "pp|tg" || true
    done
    echo "profile done in $(($(date +%s) - t_start)) s"
    exit 0
fi

if [[ "${GPU_CHECK_MOE:-0}" == 1 ]]; then
    # A mixture of experts, the Qwen3-30B-A3B shape (16 of its 48 layers,
    # Q4_K_M; the llama vocabulary already carried, 32000 tokens for its
    # 151936, keeps the carry under 64 MiB): experts on the GPU, then kept in
    # host memory for half the layers and for all of them (--n-cpu-moe,
    # --cpu-moe); the CPU alone last. Writing the 6 GB file takes a minute or
    # two on 16 cores.
    say "mixture of experts: qwen3-30b-a3b shape, 16 layers, Q4_K_M"
    moe=/tmp/kvrun-qwen3-30b-a3b-16l-Q4_K_M.gguf
    [[ -f "$moe" ]] || timeout 300 ./kvrun synth --preset qwen3-30b-a3b --type Q4_K_M \
        --vocab "$vocab" -o "$moe" -t "$nt" >/dev/null || die "kvrun synth qwen3-30b-a3b"
    for row in "cuda|-ngl all" "cuda, --n-cpu-moe 8|-ngl all --n-cpu-moe 8" \
               "cuda, --cpu-moe|-ngl all --cpu-moe" "cpu|--device cpu"; do
        IFS='|' read -r label flags <<<"$row"
        # shellcheck disable=SC2086
        timeout 180 ./kvrun bench -m "$moe" -p 512 -n 64 -r 2 -t "$nt" $flags </dev/null 2>/dev/null |
            grep -E "pp|tg" | sed "s/^/$label /" || echo "FAILED: $label"
    done
    echo "moe done in $(($(date +%s) - t_start)) s"
    exit 0
fi

say "CUDA tests"
export KVRUN_SHARED_DIR=$DATA_DIR
rc=0
timeout 240 "$BUILD/kvrun_tests" -tc='cuda*,coherence*' >"$BUILD.cuda-tests.log" 2>&1 || rc=$?
grep -E "MESSAGE|skipped|max \||worst|ERROR|FAILED|test cases|assertions|Status|backend|graphs" "$BUILD.cuda-tests.log" |
    grep -v "^=*$" | head -120 || true
if [[ $rc != 0 ]]; then
    tail -80 "$BUILD.cuda-tests.log"
    check_failed "CUDA tests (exit $rc; full log: $BUILD.cuda-tests.log)"
fi
if [[ "${GPU_CHECK_SANITIZE:-0}" == 1 ]]; then
    say "compute-sanitizer memcheck"
    timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/kvrun_tests" \
        -tc='cuda attention*,cuda ops*' || check_failed "compute-sanitizer"
fi

if [[ "${GPU_CHECK_TESTS_ONLY:-0}" == 1 ]]; then
    ((${#failures[@]} == 0)) || die "${#failures[@]} failed: ${failures[*]}"
    echo "tests only: done in $(($(date +%s) - t_start)) s"
    exit 0
fi

say "benchmark: tinyllama-1.1b shapes (synthetic weights), kvrun bench pp256 / tg64"
# One `kvrun bench --json` run; appends rows "| label | test | tok/s ± sd |" to $table.
table=/tmp/kvrun-bench-table.md
: >"$table"
bench_rows() {
    local label=$1 out=/tmp/kvrun-bench.json
    shift
    timeout 150 ./kvrun bench --json -t "$nt" "$@" >"$out" 2>"$out.err" || {
        cat "$out.err" >&2
        check_failed "kvrun bench $label ($*)"
        return 0
    }
    python3 -c "
import json
for r in json.load(open('$out')):
    sp = r.get('speculative')
    kept = f\", {100 * sp['acceptance']:.0f}% of {sp['drafted']} drafts kept\" if sp else ''
    print(f\"| $label | {r['test']}{kept} | {r['tokens_per_second']:.1f} ± {r['stddev']:.1f} |\")
" >>"$table" || check_failed "reading $out"
}
for type in q4_0 q8_0 q4_k_m; do
    model=$(model_for "$type")
    bench_rows "$type cuda" -m "$model" -p 256 -n 64 -r 3 --device cuda
    bench_rows "$type cpu" -m "$model" -p 256 -n 64 -r 2 --device cpu
    echo "  $type done at $(($(date +%s) - t_start)) s"
done
q4=/tmp/kvrun-tinyllama-q4_0.gguf
# Partial offload: half the layers on the GPU, the rest and the head on the CPU.
bench_rows "q4_0 -ngl 11" -m "$q4" -p 256 -n 64 -r 2 -ngl 11
# Hot/cold KV at depth 4096: the whole ring on the GPU vs sinks + newest 512
# there and the older ~3.5k tokens attended on the CPU.
bench_rows "q4_0 cuda" -m "$q4" -p 0 -n 32 -d 4096 -r 2 --device cuda
bench_rows "q4_0 cuda, --kv-gpu-window 512" -m "$q4" -p 0 -n 32 -d 4096 -r 2 --device cuda --kv-gpu-window 512
# CUDA graphs: decode steps recorded and replayed (default) vs eager launches.
# The small model is where launch overhead dominates.
stories=$DATA_DIR/models/stories260K.gguf
for m in "$q4" "$stories"; do
    label=$(basename "$m" .gguf)
    bench_rows "$label cuda, graphs" -m "$m" -p 0 -n 64 -r 3 --device cuda
    KVRUN_CUDA_GRAPHS=0 bench_rows "$label cuda, KVRUN_CUDA_GRAPHS=0" -m "$m" -p 0 -n 64 -r 3 --device cuda
done
# Speculative decoding on the GPU: plain tg beside --lookup and a draft model
# (stories260K drafting for itself) in one bench run each; bench checks the
# answers are the same.
if [[ -f "$DATA_DIR/prompt-story.txt" ]]; then
    bench_rows "stories260K cuda, --lookup 8" -m "$stories" -f "$DATA_DIR/prompt-story.txt" -n 128 -r 3 \
        --device cuda --lookup 8
    bench_rows "stories260K cuda, -md itself" -m "$stories" -f "$DATA_DIR/prompt-story.txt" -n 128 -r 3 \
        --device cuda --draft-model "$stories"
fi
echo
echo "| weights, device | test | tok/s |"
echo "| --- | --- | ---: |"
cat "$table"

say "GPU memory: kvrun info plan and a run's stats line (hot/cold)"
./kvrun info -m "$q4" -c 4096 -ngl all --kv-gpu-window 512 | sed -n '/^GPU/,$p' || check_failed "kvrun info"
prompt=$(python3 -c "print(' '.join(['the'] * 200))")
timeout 120 ./kvrun -m "$q4" -p "$prompt" -n 16 -c 1024 --temp 0 --ignore-eos -v --device cuda \
    --kv-gpu-window 64 -t "$nt" 2>/tmp/kvrun-hotcold.err >/dev/null || {
    cat /tmp/kvrun-hotcold.err
    check_failed "kvrun --kv-gpu-window run"
}
grep -E "backend|\[kvrun\]" /tmp/kvrun-hotcold.err || true
grep -q "backend cuda" /tmp/kvrun-hotcold.err || check_failed "the run did not use the CUDA backend"

say "device-resident decode: transfers and graphs of a 64-token run (KVRUN_CUDA_DEBUG=1)"
KVRUN_CUDA_DEBUG=1 timeout 120 ./kvrun -m "$q4" -p "$prompt" -n 64 -c 1024 --temp 0 --ignore-eos \
    --device cuda -t "$nt" 2>/tmp/kvrun-graphs.err >/dev/null || {
    cat /tmp/kvrun-graphs.err
    check_failed "kvrun run with CUDA graphs"
}
grep -E "kvrun: CUDA|\[kvrun\]" /tmp/kvrun-graphs.err || true
if grep -q "CUDA graphs off" /tmp/kvrun-graphs.err; then check_failed "CUDA graphs fell back to eager launches"; fi
grep -qE "[1-9][0-9]* graph launches" /tmp/kvrun-graphs.err || check_failed "no CUDA graph was launched"

say "chat /stats with the model on the GPU"
python3 - "$stories" <<'PY' || check_failed "chat /stats"
import os, pty, select, signal, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv("./kvrun", ["kvrun", "chat", "-m", sys.argv[1], "-ngl", "all", "-n", "8", "--temp", "0"])
out, pos = b"", 0
def read_until(needle, t=30):
    global out, pos
    end = time.time() + t
    while out.find(needle, pos) < 0 and time.time() < end:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                out += os.read(fd, 4096)
            except OSError:
                break
    i = out.find(needle, pos)
    if i >= 0:
        pos = i + len(needle)
read_until(b"> ")
for line in (b"Hello\n", b"/stats\n"):
    os.write(fd, line)
    read_until(b"\n> ")
os.write(fd, b"/exit\n")
time.sleep(1)
if os.waitpid(pid, os.WNOHANG) == (0, 0):
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
lines = [l.strip() for l in out.decode(errors="replace").splitlines() if "[stats]" in l]
print("\n".join(lines))
sys.exit(0 if any("[stats] GPU" in l for l in lines) else 1)
PY
echo
if ((${#failures[@]})); then
    printf 'FAILED: %s\n' "${failures[@]}" >&2
    echo "gpu-check: ${#failures[@]} check(s) failed in $(($(date +%s) - t_start)) s"
    exit 1
fi
echo "gpu-check: OK in $(($(date +%s) - t_start)) s"
