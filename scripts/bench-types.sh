#!/usr/bin/env bash
# Prompt and generation speed per weight type on one shape: random-weight
# models with TinyLlama-1.1B shapes, every matrix (embedding and output
# included) in one type, made on demand with `kvrun synth` and cached in
# $KVRUN_BENCH_DIR (default /tmp/kvrun-bench; the first run takes several
# minutes, IQ4_NL's reference quantizer most of them). Each repetition runs
# `kvrun bench -p 256 -n 64 -r 1` over all the types in turn, so drift on a
# shared machine falls on every type alike; the table gives the mean and
# spread over repetitions, pp256 against Q8_0's, and tg64 as a rate of reading
# the weights, against the read roof (`kvrun-lab roofline`) and against Q4_0's
# fraction of it.
# Usage: scripts/bench-types.sh [THREADS] [REPS] [TYPE...]
#   (default types: q4_0 q8_0 q4_1 q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
reps=${2:-3}
shift $(($# < 2 ? $# : 2))
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(q4_0 q8_0 q4_1 q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k)
dir=${KVRUN_BENCH_DIR:-/tmp/kvrun-bench}
vocab=${KVRUN_VOCAB:-../shared/vocab/ggml-vocab-llama-spm.gguf}
mkdir -p "$dir"
[ -x ./kvrun ] && [ -x ./kvrun-lab ] || make build >/dev/null
models=()
for t in "${types[@]}"; do
  f="$dir/tinyllama-1.1b-$t.gguf"
  if [ ! -f "$f" ]; then
    ./kvrun synth --preset tinyllama-1.1b --type "$t" --vocab "$vocab" -o "$f.tmp"
    mv "$f.tmp" "$f"
  fi
  models+=(-m "$f")
done
roof=$(mktemp)
runs=$(mktemp)
trap 'rm -f "$roof" "$runs"' EXIT
./kvrun-lab roofline -t "$threads" --json >"$roof"
for ((r = 0; r < reps; r++)); do
  ./kvrun bench "${models[@]}" -p 256 -n 64 -t "$threads" -r 1 --json 2>/dev/null
done | python3 -c 'import json, sys; dec = json.JSONDecoder(); s = sys.stdin.read(); out = []
i = 0
while i < len(s):
    if s[i].isspace(): i += 1; continue
    v, i = dec.raw_decode(s, i); out += v
json.dump(out, sys.stdout)' >"$runs"
python3 - "$roof" "$runs" "$threads" <<'PY'
import json, statistics, sys
roof, runs, threads = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
bw = {r["threads"]: r["read_bandwidth_bytes_per_second"] for r in roof}[threads]
by = {}
for r in runs:
    t = r["model"].removeprefix("tinyllama-1.1b-").removesuffix(".gguf")
    e = by.setdefault(t, {})
    kind = "pp" if r["test"].startswith("pp") else "tg"
    e.setdefault(kind, []).append(r["tokens_per_second"])
    if kind == "tg":
        e["bytes"] = r["bytes_per_token"]
def ms(v):
    return statistics.mean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)
def frac(t):
    return ms(by[t]["tg"])[0] * by[t]["bytes"] / bw
q8 = ms(by["q8_0"]["pp"])[0] if "q8_0" in by else None
q4 = frac("q4_0") if "q4_0" in by else None
print(f"read roof {bw / 1e9:.1f} GB/s, {threads} threads, {len(by[next(iter(by))]['pp'])} repetitions\n")
print("| type | MB/token | pp256 tok/s | pp / Q8_0 pp | tg64 tok/s | GB/s read | of read roof | / Q4_0's fraction |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for t, e in by.items():
    pp, pps = ms(e["pp"])
    tg, tgs = ms(e["tg"])
    f = frac(t)
    r8 = f"{pp / q8:.2f}" if q8 else ""
    r4 = f"{f / q4:.2f}" if q4 else ""
    print(f"| {t.upper()} | {e['bytes'] / 1e6:.0f} | {pp:.0f} ± {pps:.0f} | {r8} | {tg:.1f} ± {tgs:.1f} |"
          f" {tg * e['bytes'] / 1e9:.1f} | {100 * f:.0f}% | {r4} |")
PY
