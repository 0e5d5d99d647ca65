#!/usr/bin/env bash
# kvrun batch with a shared system prompt: N requests (default 100) whose
# prompts start with the same SYS-token text (default 500) and end with a
# question of their own, TG tokens each (default 32), --parallel P (8), run
# with and without the prefix cache, then both again with --deterministic to
# show the answers do not change. Prints the summary lines (wall time, prefix
# hit rate, KV peak) and whether the answers match.
#
# Usage: scripts/bench-shared-prefix.sh MODEL.gguf   env: N, SYS, TG, P, THREADS (2)
set -euo pipefail
cd "$(dirname "$0")/.."
m=${1:?usage: $0 MODEL.gguf}
n=${N:-100} sys=${SYS:-500} tg=${TG:-32} par=${P:-8} threads=${THREADS:-2}
[ -x ./kvrun ] || make build >/dev/null
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$m" "$n" "$sys" "$tg" >"$dir/req.jsonl" <<'PY'
import json, subprocess, sys
model, n, sys_tokens, tg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
words = ("you are a careful assistant who answers questions about the weather the sea the "
         "mountains and the cities of the north with short and kind sentences").split()
def text(k): return " ".join(words[j % len(words)] for j in range(k))
def count(t):
    out = subprocess.run(["./kvrun", "tokenize", "-m", model, "-p", t, "--json"],
                         capture_output=True, text=True, check=True).stdout
    return len(json.loads(out))
lo, hi = 1, sys_tokens
while lo < hi:
    mid = (lo + hi + 1) // 2
    if count(text(mid)) <= sys_tokens: lo = mid
    else: hi = mid - 1
system = text(lo) + ".\n"
for i in range(n):
    print(json.dumps({"id": i, "prompt": system + f"Question {i}: what is number {i * 7 % 97}?",
                      "max_tokens": tg, "temperature": 0, "ignore_eos": True}))
PY
run() { # name, extra args...
  local name=$1
  shift
  ./kvrun batch -m "$m" -f "$dir/req.jsonl" --parallel "$par" -t "$threads" --ordered "$@" \
    >"$dir/$name.out" 2>"$dir/$name.err"
  echo "$name: $(grep '^\[kvrun batch\]' "$dir/$name.err")"
}
run shared
run whole --no-prefix-cache
run shared-det --deterministic
run whole-det --no-prefix-cache --deterministic
texts() { python3 -c 'import json,sys; [print(json.dumps(json.loads(l)["text"])) for l in open(sys.argv[1])]' "$1"; }
same() { cmp -s <(texts "$dir/$1.out") <(texts "$dir/$2.out") && echo "the same" || echo "different"; }
echo "answers, --deterministic, shared prefix against whole prompts: $(same shared-det whole-det)"
echo "answers, default mode, shared prefix against whole prompts: $(same shared whole)"
