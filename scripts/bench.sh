#!/usr/bin/env bash
# The standard CPU benchmark table: random-weight models with TinyLlama-1.1B
# shapes (made on demand with `kvrun synth`, never committed) in Q4_0, Q8_0
# and Q4_K_M, prompt 256 and generate 64, with the roofline (bytes read per
# generated token, fraction of this machine's read bandwidth as
# `kvrun-lab roofline` measures it), generation at depth 4096 against depth
# 0, and peak RSS; with --profile, where each generated token's time goes (per
# weight matrix, attention, the rest), and (`kvrun-lab matrices`) how fast the
# token's weight matrices stream when only read and when multiplied, through
# the same parallel loops.
# Usage: scripts/bench.sh [THREADS] [REPS]   (models cached in $KVRUN_BENCH_DIR, default /tmp/kvrun-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
reps=${2:-3}
dir=${KVRUN_BENCH_DIR:-/tmp/kvrun-bench}
vocab=${KVRUN_VOCAB:-../shared/vocab/ggml-vocab-llama-spm.gguf}
mkdir -p "$dir"
[ -x ./kvrun ] && [ -x ./kvrun-lab ] || make build >/dev/null
models=()
for t in q4_0 q8_0 q4_k_m; do
  f="$dir/tinyllama-1.1b-$t.gguf"
  if [ ! -f "$f" ]; then
    if [ "$t" = q4_k_m ]; then
      [ -f "$dir/tinyllama-1.1b-f16.gguf" ] || ./kvrun synth --preset tinyllama-1.1b --type f16 --vocab "$vocab" -o "$dir/tinyllama-1.1b-f16.gguf"
      ./kvrun quantize "$dir/tinyllama-1.1b-f16.gguf" "$f" Q4_K_M
    else
      ./kvrun synth --preset tinyllama-1.1b --type "$t" --vocab "$vocab" -o "$f"
    fi
  fi
  models+=(-m "$f")
done
# The roof first, on an idle machine; then kvrun bench's figures as JSON, put
# against it here: kvrun itself reports only what a user compares engines by.
roof=$(mktemp)
runs=$(mktemp)
trap 'rm -f "$roof" "$runs"' EXIT
./kvrun-lab roofline -t "$threads" --json >"$roof"
./kvrun bench "${models[@]}" -p 256 -n 64 -t "$threads" -r "$reps" --profile --json >"$runs"
# table: tok/s with MB per generated token, the rate it read them at, that
# rate's fraction of the roof, and the thread pool's hand-offs per token at
# the roof's hand-off cost. profile: each row's ops (kvrun bench --profile's
# table) with each rate's fraction of the roof.
show() {
  python3 - "$1" "$roof" "$runs" <<'PY'
import json, sys
what, roof, runs = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
bw = {r["threads"]: r["read_bandwidth_bytes_per_second"] for r in roof}
handoff = {r["threads"]: r["handoff_seconds"] for r in roof}
if what == "table":
    print("| model | test | threads | tok/s | MB/token | GB/s read | of bandwidth | thread sync per token |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        tps, t = r["tokens_per_second"], r["threads"]
        extra = "| | | |"
        if "bytes_per_token" in r:
            b, h, c = r["bytes_per_token"], r.get("handoffs_per_token", 0), handoff[t]
            extra = (f"{b / 1e6:.1f} | {tps * b / 1e9:.1f} | {100 * tps * b / bw[t]:.0f}% of {bw[t] / 1e9:.1f} GB/s"
                     f" | {h:.0f} x {c * 1e6:.2f} us = {100 * h * c * tps:.1f}% |")
        print(f"| {r['model']} | {r['test']} | {t} | {tps:.2f} ± {r['stddev']:.2f} | {extra}")
else:
    for r in runs:
        p, b = r.get("profile"), bw[r["threads"]]
        if not p:
            continue
        tok = p["seconds_per_token"]
        print(f"\nprofile of {r['test']} on {r['model']}, {r['threads']} threads: {tok * 1e3:.2f} ms per token\n")
        print("| op | calls/token | MB/token | ms/token | share | GB/s read | of bandwidth |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for o in p["ops"]:
            s, n = o["seconds_per_token"], o["bytes_per_token"]
            mb, rate = (f"{n / 1e6:.1f}", f" {n / s / 1e9:.1f} | {100 * n / s / b:.0f}% |") if n > 0 else ("", " | |")
            print(f"| {o['op']} | {o['calls_per_token']:.3g} | {mb} | {s * 1e3:.3f} | {100 * s / tok:.1f}% |{rate}")
        out = max(0.0, tok - sum(o["seconds_per_token"] for o in p["ops"]))
        print(f"| outside the ops | | | {out * 1e3:.3f} | {100 * out / tok:.1f}% | | |")
PY
}
show table
echo
./kvrun-lab matrices "${models[@]}" -t "$threads" -r "$reps"
show profile
echo
echo "generation with 4096 tokens already in the (F16) cache, against an empty cache:"
./kvrun bench "${models[@]}" -p 0 -n 32 -d 0,4096 -t "$threads" -r "$reps" --profile |
  awk -F'|' '
    { print }
    $3 ~ /tg[0-9]+ *$/ { gsub(/ /, "", $2); split($5, v, " "); d0[$2] = v[1] }
    $3 ~ /@d4096/ { gsub(/ /, "", $2); split($5, v, " "); d4[$2] = v[1] }
    END { for (m in d4) if (d0[m] > 0) printf "  %s: tg@d4096 / tg@d0 = %.0f%%\n", m, 100 * d4[m] / d0[m] }'
echo
echo "peak RSS (generate 64 after a 256-token prompt):"
for t in q4_0 q8_0 q4_k_m; do
  f="$dir/tinyllama-1.1b-$t.gguf"
  rss=$(./kvrun -m "$f" -p "$(printf 'hello %.0s' $(seq 1 250))" -n 64 --ignore-eos --temp 0 -t "$threads" 2>&1 >/dev/null | sed -nE 's/.*peak RSS ([0-9.]+ [KMG]iB).*/\1/p')
  echo "  $t: file $(du -h "$f" | cut -f1), peak RSS $rss"
done
