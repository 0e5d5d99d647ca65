#!/usr/bin/env bash
# Does a static kvrun (make static, make aarch64) run on a machine that has
# nothing else? Checks that the binary has no program interpreter and no
# shared libraries, then runs it in an empty chroot holding only itself and
# stories260K.gguf (no /proc, /dev, /etc, /usr/share/terminfo, no HOME):
#   - `kvrun --version`;
#   - 100 greedy tokens of the stories260K golden "story" prompt, whose text
#     must be the start of the reference engine's (../shared/golden);
#   - `kvrun chat` with a piped message (one answer, then exit);
#   - `kvrun chat` on a terminal (script(1) gives it a pty) with TERM naming
#     a terminal the missing terminfo database cannot describe: libedit must
#     still read the lines, answer, and leave on /exit.
# An aarch64 binary on another host runs under qemu-aarch64-static (Debian:
# qemu-user-static), copied into the chroot: it needs nothing there either.
# Needs root for chroot, or unprivileged user namespaces (unshare -r).
# Usage: scripts/static-check.sh [BINARY (build-static/kvrun)] [MODEL]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build-static/kvrun}
model=${2:-../shared/models/stories260K.gguf}
golden=../shared/golden/stories260K__story.json
fail() {
  echo "static-check: $*" >&2
  exit 1
}
[ -x "$bin" ] || fail "$bin: no such executable (make static, or make aarch64)"
[ -f "$model" ] || fail "$model: no such model"

# No PT_INTERP (the loader) and no DT_NEEDED (shared libraries).
readelf -lW "$bin" | grep -q 'Requesting program interpreter' && fail "$bin asks for a dynamic loader"
readelf -dW "$bin" | grep -q '(NEEDED)' && fail "$bin needs shared libraries: $(readelf -dW "$bin" | grep NEEDED)"
machine=$(readelf -hW "$bin" | sed -n 's/^ *Machine: *//p')

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
cp "$bin" "$root/kvrun"
cp "$model" "$root/model.gguf"
run=(/kvrun)
if [ "$machine" = AArch64 ] && [ "$(uname -m)" != aarch64 ]; then
  qemu=$(command -v qemu-aarch64-static) || fail "an aarch64 binary here needs qemu-aarch64-static (qemu-user-static)"
  cp "$qemu" "$root/qemu"
  run=(/qemu -cpu max /kvrun)
fi
chroot=$(PATH=$PATH:/usr/sbin:/sbin command -v chroot) || fail "chroot not found"
if [ "$(id -u)" = 0 ]; then
  enter=("$chroot" "$root")
else
  enter=("$(command -v unshare)" -r "$chroot" "$root")
fi
# A clean environment: no HOME, no LANG; TERM only where a test sets it.
in_root() { env -i "${enter[@]}" "${run[@]}" "$@"; }

echo "== $bin ($machine): no loader, no shared libraries"
version=$(in_root --version </dev/null) || fail "--version failed"
[[ $version == kvrun\ * ]] || fail "--version printed: $version"
echo "   $version"

echo "== 100 greedy tokens of the golden story prompt, in an empty chroot"
text=$(in_root -m /model.gguf -p "Once upon a time" -n 100 --temp 0 --quiet </dev/null) || fail "generation failed"
python3 - "$golden" "$text" <<'EOF' || fail "generated text is not the golden's"
import json, sys
want = json.load(open(sys.argv[1]))["gen_text"]
got = sys.argv[2]
if len(got) < 200 or not want.startswith(got):
    print(f"static-check: got {got!r}\nstatic-check: golden starts {want[:len(got) + 20]!r}", file=sys.stderr)
    sys.exit(1)
print(f"   {len(got)} characters equal the golden's: {got[:60]!r}...")
EOF

echo "== chat, message piped on stdin"
answer=$(echo "Once upon a time" | in_root chat -m /model.gguf --temp 0 -n 30 2>&1) || fail "piped chat failed: $answer"
[ -n "${answer//[[:space:]]/}" ] || fail "piped chat printed nothing"
echo "   ${answer:0:60}..."

echo "== chat on a terminal without a terminfo database (TERM=xterm-256color)"
# script(1) runs the command on a new pty and copies its own stdin to it:
# two messages, then /exit; the typed text is echoed back by libedit.
transcript=$(printf 'Once upon a time\n/stats\n/exit\n' |
  timeout 120 script -qec "env -i TERM=xterm-256color ${enter[*]} ${run[*]} chat -m /model.gguf --temp 0 -n 20" /dev/null) ||
  fail "chat on a pty failed or hung (status $?): $transcript"
grep -q '\[stats\] last turn: .*generated [1-9]' <<<"$transcript" || fail "chat on a pty did not answer /stats: $transcript"
echo "   answered, /stats, /exit: ok"
echo "static-check: ok"
