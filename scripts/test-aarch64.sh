#!/usr/bin/env bash
# The aarch64 (Jetson Orin CPU) path: cross-compile the tensor runtime with
# its NEON kernels, the model side (src/ without the CLI and chat) and two
# sets of tests, then run them under qemu-aarch64:
#   - the kernel tests (every table against the scalar reference on odd
#     sizes), on a CPU model with dot-product instructions (-cpu max) and on
#     one without (-cpu cortex-a72: the scalar fallback);
#   - the golden conformance tests (tests/test_golden.cpp: logits of the
#     reference engine in ../shared/golden, teacher-forced and free-running)
#     on -cpu max, for the shortest prompt of every model: F32 stories260K,
#     F16, Q8_0, Q4_0, Q4_K_M, Q6_K and qwen2 Q8_0 with its BPE vocabulary
#     (about 20 s; every file and cache type takes about 15 minutes under
#     emulation: GOLDENS=all).
# Needs g++-aarch64-linux-gnu, qemu-user and libutf8proc-dev:arm64 (make deps).
# JOBS parallel compiles (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-aarch64}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
# Subcases (golden file names) of "golden: every reference file"; "story" is
# the shortest prompt, and for stories260K it checks 100 tokens of
# free-running greedy generation.
goldens=${GOLDENS:-'*__story.json'}
shared_dir=$(cd .. && pwd)/shared
utf8proc_lib=/usr/lib/aarch64-linux-gnu/libutf8proc.a
if [ ! -f "$utf8proc_lib" ]; then
  echo "test-aarch64: $utf8proc_lib missing; install libutf8proc-dev:arm64 (make deps)" >&2
  exit 1
fi

mkdir -p "$out"
CXX=aarch64-linux-gnu-g++
# The headers of doctest, fmt, nlohmann-json and utf8proc are
# architecture-independent; the cross compiler finds them in /usr/include,
# its last search directory, after its own. fmt is used header-only, so
# utf8proc is the one arm64 library needed.
flags=(-std=c++20 -O2 -Wall -Wextra -Werror -MMD -I. -Isrc -pthread -DFMT_HEADER_ONLY
  -DKVRUN_SHARED_DIR="\"$shared_dir\"" -DKVRUN_BINARY="\"/kvrun-cli-not-built-for-aarch64\"")

# Rebuild an object when its source or any header it included (the .d file
# written by -MMD) is newer.
stale() {
  local obj=$1 dep=${1%.o}.d f
  [ -f "$obj" ] && [ -f "$dep" ] || return 0
  for f in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$dep"); do
    [ "$f" -nt "$obj" ] && return 0
  done
  return 1
}

pids=()
compile() { # src obj [extra flags]
  local src=$1 obj=$2
  shift 2
  $CXX "${flags[@]}" "$@" -c "$src" -o "$obj"
}
lib_objs=()
test_objs=()
for src in ggml-like/*.cpp ggml-like/cpu/*.cpp ggml-like/cuda/cuda_stub.cpp src/*.cpp \
  tests/main.cpp tests/test_util.cpp tests/test_kernels.cpp tests/test_kernels_k.cpp tests/test_golden.cpp; do
  case "$src" in
    ggml-like/cpu/x86_*) continue ;;
    ggml-like/cuda/cuda_stub.cpp) [ -f "$src" ] || continue ;;
    # Not on the inference path the tests take (chat, prompt cache, writing
    # GGUF, the CLI's memory plan): about 35 s of compiling saved.
    src/chat_session.cpp | src/chat_template.cpp | src/prompt_cache.cpp | src/gguf_writer.cpp | src/memory_plan.cpp) continue ;;
  esac
  extra=()
  case "$src" in ggml-like/cpu/arm_neon*) extra=(-march=armv8.2-a+dotprod+fp16) ;; esac
  obj="$out/$(echo "$src" | tr / _).o"
  if stale "$obj"; then
    compile "$src" "$obj" "${extra[@]}" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then
      wait "${pids[0]}"
      pids=("${pids[@]:1}")
    fi
  fi
  case "$src" in tests/*) test_objs+=("$obj") ;; *) lib_objs+=("$obj") ;; esac
done
for p in "${pids[@]}"; do wait "$p"; done
# The library side as an archive, so the link takes only what the tests use.
rm -f "$out/libkvrun.a"
aarch64-linux-gnu-ar rcs "$out/libkvrun.a" "${lib_objs[@]}"
# Static: with libc6:arm64 installed (a dependency of libutf8proc-dev:arm64),
# a dynamic binary run with -L /usr/aarch64-linux-gnu gets the cross
# toolchain's ld.so but the multiarch libc.so.6, a different build of glibc,
# and hangs in pthread_create.
$CXX -static -pthread "${test_objs[@]}" "$out/libkvrun.a" "$utf8proc_lib" -o "$out/aarch64_tests"

run() { # cpu, doctest args...
  local cpu=$1
  shift
  qemu-aarch64 -cpu "$cpu" "$out/aarch64_tests" "$@"
}
echo "== NEON kernels (qemu -cpu max)"
run max -tce='golden*'
if [ "$goldens" = all ]; then
  echo "== goldens on the NEON path (qemu -cpu max): all"
  run max -tc='golden*'
else
  echo "== goldens on the NEON path (qemu -cpu max): $goldens"
  run max -tc='golden: every reference file*' -sc="$goldens"
fi
echo "== no dot-product instructions (qemu -cpu cortex-a72): scalar fallback kernels"
run cortex-a72 -tce='golden*'
