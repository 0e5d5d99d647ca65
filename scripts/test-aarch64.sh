#!/usr/bin/env bash
# The aarch64 (Jetson Orin CPU) path: cross-compile the tensor runtime with
# its NEON kernels and the kernel tests (every table against the scalar
# reference on odd sizes), then run them under qemu-aarch64 on a CPU model
# with dot-product instructions. Needs g++-aarch64-linux-gnu and qemu-user.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-aarch64}
mkdir -p "$out/inc/doctest"
cp /usr/include/doctest/doctest.h "$out/inc/doctest/" # header-only; keep host headers out of the cross build
CXX=aarch64-linux-gnu-g++
flags=(-std=c++20 -O2 -Wall -Wextra -Werror -I. -I"$out/inc" -pthread)
objs=()
for src in ggml-like/*.cpp ggml-like/cpu/*.cpp ggml-like/cuda/cuda_stub.cpp tests/main.cpp tests/test_kernels.cpp tests/test_kernels_k.cpp; do
  case "$src" in
    ggml-like/cpu/x86_*) continue ;;
    ggml-like/cuda/cuda_stub.cpp) [ -f "$src" ] || continue ;;
  esac
  extra=()
  case "$src" in ggml-like/cpu/arm_neon*) extra=(-march=armv8.2-a+dotprod+fp16) ;; esac
  obj="$out/$(echo "$src" | tr / _).o"
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then
    $CXX "${flags[@]}" "${extra[@]}" -c "$src" -o "$obj"
  fi
  objs+=("$obj")
done
$CXX -pthread "${objs[@]}" -o "$out/kernel_tests"
echo "== NEON (qemu -cpu max)"
qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu "$out/kernel_tests"
echo "== no dot-product instructions (qemu -cpu cortex-a72): scalar fallback"
qemu-aarch64 -cpu cortex-a72 -L /usr/aarch64-linux-gnu "$out/kernel_tests"
