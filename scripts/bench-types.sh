#!/usr/bin/env bash
# Prompt and generation speed per weight type on one shape: random-weight
# models with TinyLlama-1.1B shapes, every matrix (embedding and output
# included) in one type, made on demand with `kvrun synth` and cached in
# $KVRUN_BENCH_DIR (default /tmp/kvrun-bench; the first run takes several
# minutes, IQ4_NL's reference quantizer most of them). Each repetition runs
# `kvrun-lab roofline` and then `kvrun bench -p 256 -n 64 -r 1` over all the
# types in turn, so drift on a shared machine falls on every type alike; the
# table gives medians and ranges over repetitions: pp256, and its ratio to
# Q8_0's in the same repetition; tg64 as a rate of reading the weights against
# the read roof measured in that repetition, and against Q4_0's rate in it.
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
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
# One line per repetition: the read roof measured just before it, then the
# runs of every type.
for ((r = 0; r < reps; r++)); do
  echo "{\"roof\": $(./kvrun-lab roofline -t "$threads" --json), \"runs\": $(./kvrun bench "${models[@]}" -p 256 -n 64 -t "$threads" -r 1 --json 2>/dev/null | tr -d '\n')}" | tr -d '\n'
  echo
done >"$runs"
python3 - "$runs" "$threads" <<'PY'
import json, statistics, sys
reps, threads = [json.loads(l) for l in open(sys.argv[1]) if l.strip()], int(sys.argv[2])
by, roofs = {}, []
for rep in reps:
    bw = {r["threads"]: r["read_bandwidth_bytes_per_second"] for r in rep["roof"]}[threads]
    roofs.append(bw)
    for r in rep["runs"]:
        t = r["model"].removeprefix("tinyllama-1.1b-").removesuffix(".gguf")
        e = by.setdefault(t, {"pp": [], "tg": [], "frac": []})
        if r["test"].startswith("pp"):
            e["pp"].append(r["tokens_per_second"])
        else:
            e["tg"].append(r["tokens_per_second"])
            e["bytes"] = r["bytes_per_token"]
            e["frac"].append(r["tokens_per_second"] * r["bytes_per_token"] / bw)
    # Each type's read rate against Q4_0's in the same repetition.
    rate = {t: e["frac"][-1] for t, e in by.items() if len(e["frac"]) == len(roofs)}
    for t, e in by.items():
        if "q4_0" in rate and t in rate:
            e.setdefault("vs_q4", []).append(rate[t] / rate["q4_0"])
        if e["pp"] and "q8_0" in by and len(by["q8_0"]["pp"]) == len(e["pp"]):
            e.setdefault("vs_q8", []).append(e["pp"][-1] / by["q8_0"]["pp"][-1])
med = statistics.median
def span(v):
    return f"{med(v):.0f} ({min(v):.0f}-{max(v):.0f})" if max(v) >= 100 else f"{med(v):.1f} ({min(v):.1f}-{max(v):.1f})"
print(f"{threads} threads, {len(reps)} repetitions; read roof {med(roofs) / 1e9:.1f} GB/s"
      f" ({min(roofs) / 1e9:.1f}-{max(roofs) / 1e9:.1f}); medians (range)\n")
print("| type | MB/token | pp256 tok/s | pp / Q8_0's | tg64 tok/s | of read roof | read rate / Q4_0's |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for t, e in by.items():
    f = med(e["frac"])
    r8 = f"{med(e['vs_q8']):.2f}" if "vs_q8" in e else ""
    r4 = f"{med(e['vs_q4']):.2f}" if "vs_q4" in e else ""
    print(f"| {t.upper()} | {e['bytes'] / 1e6:.0f} | {span(e['pp'])} | {r8} | {span(e['tg'])} |"
          f" {100 * f:.0f}% ({100 * min(e['frac']):.0f}-{100 * max(e['frac']):.0f}%) | {r4} |")
PY
