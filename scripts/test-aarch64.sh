#!/usr/bin/env bash
# The aarch64 (Jetson Orin CPU) path: cross-compile the tensor runtime with
# its NEON kernels, the engine (src/ without the CLI) and two sets of tests
# with CMake (cmake/aarch64.cmake), then run them under qemu-aarch64:
#   - the kernel tests (every table against the scalar reference on odd
#     sizes), on a CPU model with dot-product instructions (-cpu max) and on
#     one without (-cpu cortex-a72: the scalar fallback);
#   - the golden conformance tests (tests/test_golden.cpp: logits of the
#     reference engine in ../shared/golden, teacher-forced and free-running)
#     on -cpu max, for the shortest prompt of every model: F32 stories260K,
#     F16, Q8_0, Q4_0, Q4_K_M, Q6_K and qwen2 Q8_0 with its BPE vocabulary
#     (about 20 s; every file and cache type takes about 15 minutes under
#     emulation: GOLDENS=all);
#   - the Jetson binary itself (make aarch64: kvrun, static) in an empty
#     chroot under qemu-aarch64-static: --version, the stories260K golden's
#     first 100 greedy tokens, chat piped and on a terminal
#     (scripts/static-check.sh).
# Needs g++-aarch64-linux-gnu, qemu-user, qemu-user-static, libutf8proc-dev:arm64
# and libedit-dev, libncurses-dev and libbsd-dev for arm64 (make deps); root
# or user namespaces for the chroot.
# JOBS parallel compiles (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-aarch64}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
# Subcases (golden file names) of "golden: every reference file"; "story" is
# the shortest prompt, and for stories260K it checks 100 tokens of
# free-running greedy generation.
goldens=${GOLDENS:-'*__story.json'}
for need in utf8proc:libutf8proc-dev edit:libedit-dev tinfo:libncurses-dev bsd:libbsd-dev md:libmd-dev; do
  lib=/usr/lib/aarch64-linux-gnu/lib${need%%:*}.a
  if [ ! -f "$lib" ]; then
    echo "test-aarch64: $lib missing; install ${need#*:}:arm64 (make deps)" >&2
    exit 1
  fi
done
command -v qemu-aarch64-static >/dev/null || {
  echo "test-aarch64: qemu-aarch64-static missing; install qemu-user-static (make deps)" >&2
  exit 1
}

# The same build description as the main build (CMakeLists.txt), in its
# cross-test mode: the runtime, the engine and the kernel and golden tests.
# Static: with libc6:arm64 installed (a dependency of libutf8proc-dev:arm64),
# a dynamic binary would get the cross toolchain's ld.so but the multiarch
# libc.so.6, a different build of glibc, and hang in pthread_create.
cmake -S . -B "$out" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64.cmake -DCMAKE_BUILD_TYPE=Release \
  -DKVRUN_CROSS_TESTS=ON -DKVRUN_WERROR=ON >/dev/null
cmake --build "$out" -j"$jobs" --target kvrun_tests kvrun
cp "$out/kvrun_tests" "$out/aarch64_tests"

run() { # cpu, doctest args...
  local cpu=$1
  shift
  qemu-aarch64 -cpu "$cpu" "$out/aarch64_tests" "$@"
}
echo "== NEON kernels (qemu -cpu max)"
run max -tce='golden*,real:*'
if [ "$goldens" = all ]; then
  echo "== goldens on the NEON path (qemu -cpu max): all"
  run max -tc='golden*'
else
  echo "== goldens on the NEON path (qemu -cpu max): $goldens"
  run max -tc='golden: every reference file*' -sc="$goldens"
fi
echo "== no dot-product instructions (qemu -cpu cortex-a72): scalar fallback kernels"
run cortex-a72 -tce='golden*,real:*'
echo "== the static aarch64 kvrun in an empty chroot (qemu-aarch64-static -cpu max)"
scripts/static-check.sh "$out/kvrun"
