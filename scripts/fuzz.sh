#!/usr/bin/env bash
# Build the libFuzzer targets with clang into build-fuzz, then run each for N
# seconds (default 30): scripts/fuzz.sh [SECONDS]
#
#   fuzz_gguf       GGUF reader + model binder; seeds: the GGUF files in
#                   ../shared and small models the target writes itself
#   fuzz_tokenizer  encode/decode of arbitrary bytes; seeds: the tokenizer
#                   test strings in ../shared/vocab
#   fuzz_prompt_cache  the prompt-cache loader (stories260K); seeds: caches
#                   the target writes itself
#   fuzz_chat_load  chat /load of a save (JSON + binary cache); seeds: saves
#                   the target writes itself
#   fuzz_vocab      Vocab/Tokenizer built from a hostile vocabulary; seeds:
#                   ../shared/vocab's GGUF files and tiny ones the target writes
#   fuzz_batch_request  kvrun batch's request reader (a JSON line, a --lines
#                   message; stories260K); seeds: lines the target writes
#   fuzz_api_request  kvrun serve's request reader (an HTTP body as OpenAI's
#                   chat and completions routes read it; stories260K); seeds:
#                   bodies the target writes
#   fuzz_grammar    the GBNF compiler and the matcher (any bytes as a grammar,
#                   then as its input); seeds: grammars the target writes
#
# The corpora grow in build-fuzz/corpus-*; crash inputs land in fuzz-out/.
# Exits non-zero when a target crashes (or fails to build).
# Environment: CC/CXX (default clang/clang++), JOBS (build jobs, default 2),
# FUZZ_TARGETS (default: all eight).
set -euo pipefail

secs=${1:-30}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=$(cd "$root/../shared" && pwd)
build=$root/build-fuzz
out=$root/fuzz-out
targets=${FUZZ_TARGETS:-fuzz_gguf fuzz_tokenizer fuzz_prompt_cache fuzz_chat_load fuzz_vocab fuzz_batch_request fuzz_api_request fuzz_grammar}

# Instrument the libraries too (coverage for libFuzzer, ASan/UBSan checks in
# the parser itself); the fuzz targets add -fsanitize=fuzzer when linking.
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S "$root" -B "$build" \
    -DKVRUN_FUZZ=ON -DKVRUN_OPENBLAS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" >/dev/null
# shellcheck disable=SC2086
cmake --build "$build" -j "${JOBS:-2}" --target $targets

mkdir -p "$out"
failed=()
for t in $targets; do
    corpus=$build/corpus-${t#fuzz_}
    seeds=$build/seeds-${t#fuzz_}
    rm -rf "$seeds"
    mkdir -p "$corpus" "$seeds"
    args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024
          -artifact_prefix="$out/$t-" -print_final_stats=1)
    case $t in
    fuzz_gguf)
        cp "$shared"/vocab/*.gguf "$shared"/models/stories260K.gguf "$seeds"/
        KVRUN_FUZZ_WRITE_SEEDS=$seeds "$build/$t"
        args+=(-max_len=2000000)
        ;;
    fuzz_tokenizer)
        # One seed per test string of the reference vectors.
        for inp in "$shared"/vocab/*.inp; do
            awk -v dir="$seeds" -v base="$(basename "$inp")" '
                /^__ggml_vocab_test__$/ { n++; next }
                { f = dir "/" base "-" n; if (seen[f]++) printf "\n" >> f; printf "%s", $0 >> f }
            ' "$inp"
        done
        export KVRUN_FUZZ_VOCAB=${KVRUN_FUZZ_VOCAB:-$shared/vocab/ggml-vocab-llama-spm.gguf}
        export KVRUN_FUZZ_VOCAB_BPE=${KVRUN_FUZZ_VOCAB_BPE:-$shared/vocab/ggml-vocab-gpt-2.gguf}
        args+=(-max_len=4096)
        ;;
    fuzz_prompt_cache | fuzz_chat_load)
        export KVRUN_FUZZ_MODEL=${KVRUN_FUZZ_MODEL:-$shared/models/stories260K.gguf}
        KVRUN_FUZZ_WRITE_SEEDS=$seeds "$build/$t"
        args+=(-max_len=200000)
        ;;
    fuzz_batch_request | fuzz_api_request)
        export KVRUN_FUZZ_MODEL=${KVRUN_FUZZ_MODEL:-$shared/models/stories260K.gguf}
        KVRUN_FUZZ_WRITE_SEEDS=$seeds "$build/$t"
        args+=(-max_len=8192)
        ;;
    fuzz_grammar)
        KVRUN_FUZZ_WRITE_SEEDS=$seeds "$build/$t"
        args+=(-max_len=16384)
        ;;
    fuzz_vocab)
        cp "$shared"/vocab/*.gguf "$seeds"/
        KVRUN_FUZZ_WRITE_SEEDS=$seeds "$build/$t"
        args+=(-max_len=2000000)
        ;;
    esac
    echo "== $t: ${secs}s, seeds $(find "$seeds" -type f | wc -l), corpus $(find "$corpus" -type f | wc -l)"
    if ! (cd "$root" && "$build/$t" "${args[@]}" "$corpus" "$seeds"); then
        echo "== $t: FAILED (crash input in $out/)" >&2
        failed+=("$t")
    fi
done

if ((${#failed[@]})); then
    echo "fuzz.sh: crashes in: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz.sh: no crashes"
