# Thin wrapper over CMake (the source of truth). See README.md.
BUILD     ?= build
ASAN_BUILD?= build-asan
FUZZ_BUILD?= build-fuzz
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SECONDS ?= 20
CMAKE_FLAGS ?=
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEPS := build-essential cmake pkg-config libcli11-dev libfmt-dev doctest-dev nlohmann-json3-dev \
        libutf8proc-dev libopenblas-dev clang libclang-rt-dev
MODEL ?= $(firstword $(wildcard models/stories260K.gguf ../shared/models/stories260K.gguf) models/stories260K.gguf)

.PHONY: all build deps run test test-unit test-asan fuzz fuzz-smoke clean format

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

deps:
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(DEPS)

# The main job: build, then tell the default story.
run: build
	@[ -f "$(MODEL)" ] || scripts/download-model.sh stories260K
	./kvrun -m $(MODEL) -p "Once upon a time" -n 200 --temp 0

# Everything: unit + conformance tests, the same tests under ASan/UBSan, and
# a short run of each fuzzer.
test: test-unit test-asan fuzz-smoke

test-unit: build
	cd $(BUILD) && ctest --output-on-failure

test-asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVRUN_SANITIZE=ON -DKVRUN_OPENBLAS=OFF
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure

fuzz-smoke:
	scripts/fuzz.sh $(FUZZ_SECONDS)

fuzz:
	scripts/fuzz.sh 300

format:
	clang-format -i main.cpp src/*.cpp src/*.h src/cli/*.cpp src/cli/*.h ggml-like/*.cpp ggml-like/*.h \
	  ggml-like/cpu/*.cpp tests/*.cpp tests/*.h tests/fuzz/*.cpp

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) kvrun
