#!/usr/bin/env python3
"""kvrun serve against llama-server: aggregate tok/s and time to first token
with 1, 4 and 8 concurrent streaming clients, one run, alternated.

  scripts/bench-serve.py -m MODEL.gguf [--llama-server PATH] [--clients 1,4,8]
      [--requests 4] [--max-tokens 64] [--threads 2] [--ctx 1024] [--parallel 8]

Both servers run on 127.0.0.1 with the same model, threads, context per
sequence and sequences at once (llama-server: -np N, -c N x ctx, continuous
batching); they stay up for the whole run and take turns at each client
count (kvrun first, then llama-server), after a warm-up request each. Each
client sends --requests streaming requests one after another; every
request has a prompt of its own (about 100 tokens, the distinct part first
so that no prefix is shared) and asks for exactly --max-tokens tokens
(ignore_eos). Time to first token: from sending the request to the first
chunk with text. Aggregate tok/s: all generated tokens over the wall time
of the round. RSS: after the warm-up (idle) and the most seen during the
round (sampled every 50 ms). Prints a markdown table. Python's standard
library only.
"""

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = ("The old lighthouse keeper climbed the spiral stairs every evening, counting the steps "
        "as his father had taught him, and at the top he trimmed the wick, polished the great "
        "lens and looked out over the grey water for the fishing boats coming home. ")


def start(cmd, ready_path="/health", timeout=300):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            errors="replace")
    log, port = [], []
    got = threading.Event()

    def read():
        for line in proc.stderr:
            log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m and not port:
                port.append(int(m.group(1)))
                got.set()
        got.set()

    threading.Thread(target=read, daemon=True).start()
    return proc, log, port, got


def wait_ready(port, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"server on {port} not ready")


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def stream_one(port, prompt, max_tokens):
    """(seconds to the first text chunk, seconds in all)"""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {r.read()[:300]!r}")
    first = None
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
            first = time.perf_counter() - t0
    c.close()
    return first if first is not None else float("nan"), time.perf_counter() - t0


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def round_(port, clients, requests, max_tokens, tag, pid):
    ttft = []
    lock = threading.Lock()
    peak = [rss_mib(pid)]
    done = threading.Event()

    def sample():
        while not done.wait(0.05):
            peak[0] = max(peak[0], rss_mib(pid))

    sampler = threading.Thread(target=sample)
    sampler.start()

    def client(k):
        for j in range(requests):
            prompt = f"Story {tag}-{k}-{j}. " + TEXT * 2
            f, _ = stream_one(port, prompt, max_tokens)
            with lock:
                ttft.append(f)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    ttft.sort()
    p95 = ttft[min(len(ttft) - 1, int(round(0.95 * (len(ttft) - 1))))]
    return (clients * requests * max_tokens / wall, statistics.median(ttft) * 1e3, p95 * 1e3, wall,
            peak[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--kvrun", default=os.path.join(ROOT, "kvrun"))
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", ""))
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--requests", type=int, default=4, help="per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024, help="per sequence")
    ap.add_argument("--parallel", type=int, default=8)
    a = ap.parse_args()

    servers = []
    kv, kv_log, kv_port, kv_got = start([a.kvrun, "serve", "-m", a.model, "--port", "0",
                                         "-t", str(a.threads), "-c", str(a.ctx),
                                         "--parallel", str(a.parallel)])
    kv_got.wait(300)
    if not kv_port:
        raise SystemExit("kvrun serve did not start:\n" + "".join(kv_log))
    servers.append(("kvrun", kv, kv_port[0]))
    if a.llama_server:
        lp = free_port()
        ll = subprocess.Popen([a.llama_server, "-m", a.model, "--host", "127.0.0.1", "--port",
                               str(lp), "-t", str(a.threads), "-tb", str(a.threads),
                               "-np", str(a.parallel), "-c", str(a.ctx * a.parallel),
                               "--cont-batching", "--no-webui"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers.append(("llama-server", ll, lp))
    try:
        idle = {}
        for name, proc, port in servers:
            wait_ready(port)
            stream_one(port, "Warm-up. " + TEXT, 8)
            idle[name] = rss_mib(proc.pid)
        rows = []
        for c in [int(x) for x in a.clients.split(",")]:
            for name, proc, port in servers:
                tps, p50, p95, wall, peak = round_(port, c, a.requests, a.max_tokens, name,
                                                   proc.pid)
                rows.append((name, c, tps, p50, p95, wall, peak))
                print(f"{name:13s} {c} clients: {tps:7.1f} tok/s, first token p50 {p50:6.0f} ms "
                      f"p95 {p95:6.0f} ms ({wall:.1f} s)", file=sys.stderr, flush=True)
        print(f"\nmodel {os.path.basename(a.model)}, -t {a.threads}, {a.parallel} sequences at "
              f"once, ctx {a.ctx} each, {a.requests} requests per client, {a.max_tokens} tokens "
              f"each\n")
        print("| server | clients | tok/s (all clients) | first token p50 ms | p95 ms | "
              "RSS idle / peak MiB |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for name, c, tps, p50, p95, _, peak in rows:
            print(f"| {name} | {c} | {tps:.1f} | {p50:.0f} | {p95:.0f} | "
                  f"{idle[name]:.0f} / {peak:.0f} |")
    finally:
        for _, p, _ in servers:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
