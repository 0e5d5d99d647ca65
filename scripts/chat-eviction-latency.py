#!/usr/bin/env python3
"""Chat turns once the window is full: what each evicting turn evaluates and
how long it takes, from the REPL's own /stats (docs/performance.md, "Chat
eviction").

    scripts/chat-eviction-latency.py KVRUN MODEL [-c 512] [-n 48] [--turns 24]

Drives `KVRUN chat` through a pseudo-terminal (pexpect) with short questions,
greedy, and prints per turn: tokens evaluated, prompt seconds, turns evicted.
"""
import argparse
import re
import statistics
import time

import pexpect

QUESTIONS = [
    "What is the capital of France?", "What is the capital of Spain?",
    "What is the capital of Italy?", "What is the capital of Germany?",
    "What is the capital of Japan?", "What is the capital of Canada?",
    "Name a large river in Africa.", "Name a large river in Asia.",
    "What colour is the sky?", "What is two plus two?",
    "Who wrote Hamlet?", "What is water made of?",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvrun")
    ap.add_argument("model")
    ap.add_argument("-c", default="512")
    ap.add_argument("-n", default="48")
    ap.add_argument("--turns", type=int, default=24)
    a = ap.parse_args()
    p = pexpect.spawn(a.kvrun, ["chat", "-m", a.model, "-c", a.c, "-n", a.n, "--temp", "0",
                                "--system", "Answer briefly."],
                      encoding="utf-8", timeout=300, dimensions=(40, 250), env={"TERM": "dumb"})
    p.expect("> ")
    stats = re.compile(r"evaluated (\d+), generated (\d+) \| cache (\d+)/\d+ .*?prompt ([\d.]+) tok/s"
                       r".*?turns (\d+) \((\d+) evicted\)")
    evicted_before, rows = 0, []  # (evicts, evaluated, prompt s, turn s)
    for i in range(a.turns):
        q = QUESTIONS[i % len(QUESTIONS)]
        t0 = time.monotonic()
        p.sendline(q)
        p.expect("\r\n> ")
        wall = time.monotonic() - t0
        p.sendline("/stats")
        p.expect(r"\[stats\] last turn: .*?\r\n")
        m = stats.search(p.after)
        p.expect("> ")
        ev, gen, fill, rate, turns, evicted = (float(x) for x in m.groups())
        prompt_s = ev / rate if rate > 0 else 0.0
        evicts = evicted > evicted_before
        evicted_before = evicted
        rows.append((evicts, ev, prompt_s, wall))
        print(f"turn {i + 1:2d}: evaluated {int(ev):4d}, prompt {prompt_s * 1000:7.1f} ms, "
              f"turn {wall:5.2f} s, cache {int(fill)}, evicted so far {int(evicted)}"
              f"{'  <- evicts' if evicts else ''}", flush=True)
    p.sendline("/exit")
    p.expect(pexpect.EOF)
    first = next((i for i, r in enumerate(rows) if r[0]), len(rows))
    after = rows[first:]  # from the first eviction on: the window stays full
    if not after:
        print("no turn evicted: more --turns")
        return
    print(f"from the first eviction on ({len(after)} turns, {sum(r[0] for r in after)} evicting): "
          f"evaluated {statistics.mean(r[1] for r in after):.0f} tokens, prompt "
          f"{1000 * statistics.mean(r[2] for r in after):.0f} ms, turn "
          f"{statistics.mean(r[3] for r in after):.2f} s (mean per turn)")

if __name__ == "__main__":
    main()
