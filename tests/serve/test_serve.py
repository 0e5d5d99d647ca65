"""kvrun serve driven with the official openai client on 127.0.0.1.

  test_serve.py --kvrun PATH --chat-model SMOLLM2.gguf --tiny-model stories260K.gguf [--quick]

With a real chat model (SmolLM2): answers, streaming, stops, seeds, usage,
log-probabilities, 8 concurrent greedy answers equal to lone `kvrun -p` runs
byte for byte, cached tokens on a repeated system prompt, cancellation
mid-stream, SIGTERM letting a stream finish; a second server with one
sequence and one waiting: the queue bound, SIGTERM cancelling a stream.
With the tiny model: every error status, the API key, a bounded load run
(200 requests, 16 clients) and a fault run (clients killed mid-stream,
broken requests, a slow client), then SIGTERM.
--quick (the sanitizer build): the tiny model's checks only, a smaller load.
"""

import argparse
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import threading
import time

import openai
import pydantic

from serve_util import Checks, Server, expect, lone_run, raw_exchange

THREADS = 2
CTX = 512


def chat_checks(c, kvrun, model):
    srv = Server(kvrun, model, "-c", str(CTX), "--parallel", "8", "-t", str(THREADS),
                 "--cors-origin", "http://app.test", "--shutdown-timeout", "120")
    client = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)
    name = os.path.basename(model)[:-len(".gguf")]

    def models():
        ms = client.models.list()
        expect([m.id for m in ms.data] == [name], ms)
        status, _, body = srv.request("GET", "/v1/models/nope")
        expect(status == 404 and body["error"]["code"] == "model_not_found", body)
        # CORS: the origin given on every answer.
        status, h, _ = srv.request("GET", "/v1/models")
        expect(h.get("Access-Control-Allow-Origin") == "http://app.test", h)

    def completion_equals_lone_run():
        prompt = "The capital of France is"
        r = client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0)
        expect(r.object == "text_completion" and r.id.startswith("cmpl-"), r)
        want = lone_run(kvrun, model, prompt, 24, CTX, THREADS)
        expect(r.choices[0].text == want, (r.choices[0].text, want))
        expect(r.choices[0].finish_reason == "length", r.choices[0].finish_reason)
        _, _, tok = srv.request("POST", "/tokenize", {"content": prompt, "add_special": True})
        expect(r.usage.prompt_tokens == len(tok["tokens"]), (r.usage, tok))
        expect(r.usage.completion_tokens == 24 and r.usage.total_tokens == r.usage.prompt_tokens + 24,
               r.usage)
        _, _, de = srv.request("POST", "/detokenize", {"tokens": tok["tokens"]})
        expect(de["content"].strip() == prompt, de)

    def concurrent_equal_lone_runs():
        prompts = [f"Here is fact number {i} about the ocean:" for i in range(8)]
        with cf.ThreadPoolExecutor(8) as ex:
            got = list(ex.map(lambda p: client.completions.create(
                model=name, prompt=p, max_tokens=20, temperature=0).choices[0].text, prompts))
        m = srv.metrics()
        for p, g in zip(prompts, got):
            want = lone_run(kvrun, model, p, 20, CTX, THREADS)
            expect(g == want, (p, g, want))
        expect(m["kvrun_completion_tokens_total"] >= 160, m)

    def chat_stream_equals_whole():
        msgs = [{"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": [{"type": "text", "text": "Name three colours."}]}]
        # The first answer leaves the prompt's blocks in the pool; the next
        # two both start from them (a reused prefix may change the last bits
        # of the logits, README's "--deterministic"), so they match each other.
        client.chat.completions.create(model=name, messages=msgs, max_tokens=30, temperature=0)
        whole = client.chat.completions.create(model=name, messages=msgs, max_tokens=30,
                                               temperature=0)
        expect(whole.object == "chat.completion" and whole.choices[0].message.role == "assistant",
               whole)
        text = whole.choices[0].message.content
        expect(len(text) > 0 and not text[0].isspace(), text)
        chunks = list(client.chat.completions.create(
            model=name, messages=msgs, max_tokens=30, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        expect(chunks[0].choices[0].delta.role == "assistant", chunks[0])
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        expect(streamed == text, (streamed, text))
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        expect(finishes[-1] == whole.choices[0].finish_reason and
               all(f is None for f in finishes[:-1]), finishes)
        expect(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens ==
               whole.usage.completion_tokens, chunks[-1])
        pieces = sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content)
        expect(pieces >= 3, f"the answer came in {pieces} pieces: not streamed")

    def stop_strings():
        prompt = "The capital of France is"
        full = client.completions.create(model=name, prompt=prompt, max_tokens=24,
                                         temperature=0).choices[0].text
        cut = full[len(full) // 2:len(full) // 2 + 3]
        r = client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0,
                                      stop=[cut, "\u00a7never"])
        expect(r.choices[0].text == full[:full.index(cut)], (r.choices[0].text, full, cut))
        expect(r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
        s = "".join(ch.choices[0].text for ch in client.completions.create(
            model=name, prompt=prompt, max_tokens=24, temperature=0, stop=cut, stream=True))
        expect(s == r.choices[0].text, (s, r.choices[0].text))

    def seeds():
        def ask(seed):
            return client.completions.create(model=name, prompt="Once upon a time", max_tokens=16,
                                             temperature=1.0, seed=seed).choices[0].text
        a, b = ask(7), ask(7)
        expect(a == b, (a, b))
        others = {ask(s) for s in (8, 9, 10)}
        expect(len(others | {a}) > 1, "four seeds gave one answer")

    def max_tokens_capped():
        r = client.completions.create(model=name, prompt="Count: 1, 2, 3,", max_tokens=100000,
                                      temperature=0, extra_body={"ignore_eos": True})
        expect(r.usage.prompt_tokens + r.usage.completion_tokens <= CTX, r.usage)
        expect(r.choices[0].finish_reason == "length", r.choices[0].finish_reason)

    def cached_system_prompt():
        system = ("You are a careful assistant for a small library. " * 12).strip()
        ask = lambda q: client.chat.completions.create(  # noqa: E731
            model=name, messages=[{"role": "system", "content": system},
                                  {"role": "user", "content": q}], max_tokens=4, temperature=0)
        first = ask("Where are the maps?")
        second = ask("When do you open?")
        cached = second.usage.prompt_tokens_details.cached_tokens
        expect(cached >= 96 and cached < second.usage.prompt_tokens, (first.usage, second.usage))

    def logprobs():
        # Greedy: each token is its top alternative, and the first one's
        # log-probability is the log-softmax kvrun logits gives after the prompt.
        prompt = "The capital of France is"
        r = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0,
                                      logprobs=3)
        lp = r.choices[0].logprobs
        expect(len(lp.tokens) == 12 and "".join(lp.tokens) == r.choices[0].text, lp)
        expect(lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(12)],
               lp.text_offset)
        for tok, lpv, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            expect(len(top) == 3 and max(top.values()) == lpv and top[tok] == lpv, (tok, lpv, top))
            expect(sum(2.718281828 ** v for v in top.values()) <= 1.0001, top)
        _, _, ids = srv.request("POST", "/tokenize", {"content": prompt, "add_special": True})
        out = subprocess.run([kvrun, "logits", "-m", model, "--tokens",
                              ",".join(map(str, ids["tokens"])), "--top-k", "1"],
                             capture_output=True, text=True, timeout=120)
        last = json.loads(out.stdout)[-1]
        want = last["top"][0][1] - last["lse"]
        expect(abs(lp.token_logprobs[0] - want) < 2e-3, (lp.token_logprobs[0], want))
        # Chat, streamed: the chunks' logprobs cover every token, once.
        chunks = list(client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Say hello."}], max_tokens=10,
            temperature=0, logprobs=True, top_logprobs=2, stream=True,
            stream_options={"include_usage": True}))
        content = [c for ch in chunks if ch.choices and ch.choices[0].logprobs
                   for c in ch.choices[0].logprobs.content]
        expect(len(content) == chunks[-1].usage.completion_tokens, (len(content), chunks[-1]))
        expect(all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == c.logprob
                   for c in content), content)
        expect(all(bytes(c.bytes) == c.token.encode() for c in content
                   if "\ufffd" not in c.token), content)  # a split character's halves differ

    def cancel_mid_stream():
        stream = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Tell me a long story."}],
            max_tokens=400, temperature=0.7, stream=True, extra_body={"ignore_eos": True})
        n = 0
        for ch in stream:
            n += 1
            if n == 4:
                break
        stream.close()
        m = srv.wait_idle()
        expect(m["kvrun_requests_running"] == 0 and m["kvrun_kv_blocks_used"] == 0, m)
        deadline = time.time() + 10
        while not any("client left: cancelled" in line for line in srv.log):
            expect(time.time() < deadline, "no cancellation logged")
            time.sleep(0.05)
        status, _, _ = srv.request("GET", "/health")
        expect(status == 200, status)

    def json_object_and_grammar():
        # response_format json_object: every sampled answer parses into a
        # Python dict, and ends where the object does.
        msgs = [{"role": "user", "content": "Describe a cat as a JSON object with a name and an age."}]
        for seed in range(6):
            r = client.chat.completions.create(model=name, messages=msgs, max_tokens=300,
                                               temperature=1.0, seed=seed,
                                               response_format={"type": "json_object"})
            text = r.choices[0].message.content
            expect(r.choices[0].finish_reason == "stop", (seed, r.choices[0].finish_reason, text))
            expect(isinstance(json.loads(text), dict), (seed, text))
        # A GBNF grammar, llama-server's "grammar" field.
        r = client.completions.create(model=name, prompt="Is the sky blue? Answer:", max_tokens=10,
                                      temperature=0, extra_body={"grammar": 'root ::= " " ("yes" | "no") "."'})
        expect(r.choices[0].text in (" yes.", " no.") and r.choices[0].finish_reason == "stop", r)
        # json_schema, as the openai client sends it from a Pydantic model:
        # the answer parses into the model's class.
        class Cat(pydantic.BaseModel):
            name: str
            age: int
            indoor: bool
        for seed in range(3):
            r = client.chat.completions.parse(model=name, messages=msgs, max_tokens=300, temperature=1.0,
                                              seed=seed, response_format=Cat)
            cat = r.choices[0].message.parsed
            expect(isinstance(cat, Cat) and r.choices[0].finish_reason == "stop", r)
        bad_schema = {"type": "json_schema",
                      "json_schema": {"name": "x", "schema": {"type": "string", "format": "email"}}}
        for body, param in [({"grammar": "root ::= x"}, "grammar"),
                            ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
                            ({"response_format": bad_schema}, "response_format")]:
            try:
                client.completions.create(model=name, prompt="x", max_tokens=4, extra_body=body)
                expect(False, f"{body} was not refused")
            except openai.BadRequestError as e:
                expect(e.body["param"] == param, e.body)

    try:
        for name_, fn in [("models", models), ("completion = lone kvrun -p", completion_equals_lone_run),
                          ("json_object, json_schema, grammar", json_object_and_grammar),
                          ("8 concurrent = lone runs", concurrent_equal_lone_runs),
                          ("chat stream = whole answer", chat_stream_equals_whole),
                          ("stop strings", stop_strings), ("seeds", seeds),
                          ("max_tokens capped by the context", max_tokens_capped),
                          ("cached system prompt", cached_system_prompt),
                          ("logprobs", logprobs),
                          ("cancel mid-stream frees blocks", cancel_mid_stream)]:
            c.run("chat: " + name_, fn)
        c.run("chat: SIGTERM lets a stream in flight finish, exits 0",
              lambda: sigterm_in_flight(srv, client, name, finished=True))
    finally:
        srv.kill()


def sigterm_in_flight(srv, client, name, finished):
    """SIGTERM once a long stream has started: with time to finish it ends
    whole (finish_reason length); with --shutdown-timeout 0 it ends with
    the server's shutting_down error event. Either way kvrun exits 0."""
    out = {"text": ""}
    started = threading.Event()

    def stream():
        try:
            for ch in client.completions.create(model=name, prompt="Once upon a time",
                                                max_tokens=100, temperature=0, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True}):
                if ch.choices:
                    out["text"] += ch.choices[0].text
                    out["finish"] = ch.choices[0].finish_reason
                    started.set()
                if ch.usage:
                    out["usage"] = ch.usage
        except openai.APIError as e:
            out["error"] = str(e)
        started.set()

    t = threading.Thread(target=stream)
    t.start()
    expect(started.wait(60), "the stream never started")
    rc = srv.terminate(timeout=150)
    t.join(30)
    expect(not t.is_alive(), "the stream never ended")
    expect(rc == 0, rc)
    if finished:
        expect("error" not in out and out.get("finish") == "length" and
               out["usage"].completion_tokens == 100, out)
    else:
        expect("shutting down" in out.get("error", ""), out)


def queue_checks(c, kvrun, model):
    """One sequence at a time and one waiting: of six long requests sent
    together, the rest get 503 with Retry-After; then SIGTERM with no time
    to finish cancels the answer in flight."""
    srv = Server(kvrun, model, "-c", str(CTX), "--parallel", "1", "--max-queue", "1",
                 "--shutdown-timeout", "0", "-t", str(THREADS))
    client = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)
    name = os.path.basename(model)[:-len(".gguf")]

    def queue_full():
        expect("Access-Control-Allow-Origin" not in srv.request("GET", "/health")[1],
               "CORS headers without --cors-origin")
        body = {"prompt": "Once", "max_tokens": 120, "ignore_eos": True, "temperature": 0}
        with cf.ThreadPoolExecutor(6) as ex:
            res = list(ex.map(lambda _: srv.request("POST", "/v1/completions", body), range(6)))
        statuses = sorted(r[0] for r in res)
        expect(statuses.count(200) >= 2 and 503 in statuses, statuses)
        busy = next(r for r in res if r[0] == 503)
        expect(busy[1].get("Retry-After") == "1" and busy[2]["error"]["code"] == "server_busy",
               busy)
        srv.wait_idle()

    try:
        c.run("queue: bound gives 503 + Retry-After", queue_full)
        c.run("queue: SIGTERM cancels a stream in flight, exits 0",
              lambda: sigterm_in_flight(srv, client, name, finished=False))
    finally:
        srv.kill()


def error_checks(c, kvrun, model, quick):
    srv = Server(kvrun, model, "-c", "256", "--parallel", "4", "--max-queue", "32",
                 "--max-body", "4096", "--api-key", "sesame", "--timeout", "2", "-t", str(THREADS),
                 "--cors-origin", "http://app.test")
    auth = {"Authorization": "Bearer sesame", "Content-Type": "application/json"}
    client = openai.OpenAI(base_url=srv.base_url, api_key="sesame", max_retries=0, timeout=60)
    name = os.path.basename(model)[:-len(".gguf")]

    def status_of(body, path="/v1/completions", headers=auth):
        status, h, j = srv.request("POST", path, body, headers)
        expect(isinstance(j, dict) and set(j.get("error", {})) >= {"message", "type", "code"},
               (status, j))
        return status, h, j["error"]

    def errors():
        s, _, e = status_of("{not json")
        expect(s == 400 and e["code"] == "invalid_json", (s, e))
        s, _, e = status_of({"prompt": "x", "temperature": "hot"})
        expect(s == 400 and e["param"] == "temperature", (s, e))
        s, _, e = status_of({"prompt": "x", "n": 2})
        expect(s == 400 and e["param"] == "n", (s, e))
        s, _, e = status_of({"prompt": "x", "logit_bias": {"999999": 5}})
        expect(s == 400 and e["param"] == "logit_bias", (s, e))
        s, _, e = status_of({"messages": [{"role": "user"}]}, "/v1/chat/completions")
        expect(s == 400, (s, e))
        s, _, e = status_of({"prompt": "x", "model": "gpt-4"})
        expect(s == 404 and e["code"] == "model_not_found", (s, e))
        s, _, e = status_of({"prompt": "once " * 400})
        expect(s == 400 and e["code"] == "context_length_exceeded", (s, e))
        s, _, e = status_of({"prompt": "\udcff"}.__repr__())  # not JSON either
        expect(s == 400, (s, e))
        s, _, e = status_of('{"prompt": "x", "z": ' + "[" * 100 + "]" * 100 + "}")
        expect(s == 400 and "nests deeper" in e["message"], (s, e))
        s, _, j = srv.request("POST", "/v1/completions",
                              {"prompt": "x", "temperature": None, "top_p": None, "seed": -1,
                               "max_tokens": 2, "logprobs": None}, auth)
        expect(s == 200 and j["usage"]["completion_tokens"] <= 2, (s, j))
        s, _, e = status_of({"prompt": "x" * 5000})
        expect(s == 413, (s, e))
        s, _, e = status_of({"prompt": "x"}, "/v1/nowhere")
        expect(s == 404, (s, e))
        s, _, e = status_of({"prompt": "x"}, headers={})
        expect(s == 401 and e["code"] == "invalid_api_key", (s, e))
        s, _, e = status_of({"prompt": "x"}, headers={"Authorization": "Bearer sesamf"})
        expect(s == 401, (s, e))
        try:
            client.completions.create(model=name, prompt="x", temperature=-1)
            raise AssertionError("no error")
        except openai.BadRequestError as ex:
            expect(ex.status_code == 400 and "temperature" in str(ex), ex)
        expect(srv.request("GET", "/health")[0] == 200, "health needs no key")
        # A CORS preflight carries no key: answered; the request itself needs one.
        status, h, _ = srv.request("OPTIONS", "/v1/chat/completions",
                                   headers={"Origin": "http://app.test",
                                            "Access-Control-Request-Method": "POST"})
        expect(status == 204 and "POST" in h.get("Access-Control-Allow-Methods", "") and
               h.get("Access-Control-Allow-Origin") == "http://app.test", (status, h))
        expect(all("sesame" not in line for line in srv.log), "the key was logged")

    def load_run():
        # Bounded: n requests from 16 clients, half streamed; every answer valid.
        n = 60 if quick else 200
        rss0 = srv.rss_kib()
        lc = openai.OpenAI(base_url=srv.base_url, api_key="sesame", max_retries=5, timeout=60)

        def one(i):
            kw = dict(model=name, max_tokens=8 + i % 17, temperature=0.8, seed=i)
            if i % 2:
                chunks = list(lc.completions.create(prompt=f"Story {i}:", stream=True, **kw))
                expect(chunks[-1].choices[0].finish_reason in ("stop", "length"), chunks[-1])
                return "".join(ch.choices[0].text for ch in chunks)
            r = lc.chat.completions.create(messages=[{"role": "user", "content": f"Hi {i}"}], **kw)
            expect(r.choices[0].finish_reason in ("stop", "length"), r)
            return r.choices[0].message.content

        t0 = time.time()
        with cf.ThreadPoolExecutor(16) as ex:
            out = list(ex.map(one, range(n)))
        m = srv.wait_idle()
        rss1 = srv.rss_kib()
        print(f"     load: {n} requests, 16 clients, {time.time() - t0:.1f} s, "
              f"RSS {rss0 // 1024} -> {rss1 // 1024} MiB", flush=True)
        expect(len(out) == n, len(out))
        expect(m["kvrun_kv_blocks_used"] == 0, m)
        if not quick:  # the sanitizer's quarantine grows the RSS by itself
            expect(rss1 - rss0 < 64 * 1024, f"RSS grew by {(rss1 - rss0) // 1024} MiB")

    def fault_run():
        body = json.dumps({"prompt": "Once", "max_tokens": 200, "stream": True,
                           "ignore_eos": True}).encode()
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sesame\r\n"
               b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
               b"\r\n\r\n" + body)
        # Clients killed with SIGKILL mid-stream.
        code = ("import socket,sys\ns=socket.create_connection(('127.0.0.1',%d))\n"
                "s.sendall(sys.stdin.buffer.read())\nwhile True: s.recv(100)\n") % srv.port
        procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
                 for _ in range(4)]
        for p in procs:
            p.stdin.write(req)
            p.stdin.close()
        time.sleep(1.0)
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        # Malformed and truncated requests.
        for junk in [b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"pro",
                     b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                     b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", b"\x00\xff" * 100]:
            raw_exchange(srv.port, junk, timeout=5, shut_write=True)
        # A slow client: half a request, then silence past --timeout.
        t0 = time.time()
        raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", timeout=10)
        expect(time.time() - t0 < 8, "a silent client held its connection past --timeout")
        m = srv.wait_idle(15)
        expect(m["kvrun_kv_blocks_used"] == 0, m)
        r = client.completions.create(model=name, prompt="Once", max_tokens=4)
        expect(r.choices[0].finish_reason in ("stop", "length"), r)

    try:
        c.run("tiny: error statuses", errors)
        c.run("tiny: load run", load_run)
        c.run("tiny: fault run", fault_run)
        c.run("tiny: SIGTERM exits 0", lambda: expect(srv.terminate() == 0, "status"))
    finally:
        srv.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrun", required=True)
    ap.add_argument("--chat-model")
    ap.add_argument("--tiny-model", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    c = Checks()
    if not a.quick:
        if not a.chat_model or not os.path.exists(a.chat_model):
            sys.exit(f"the chat model {a.chat_model} is missing (make real-models)")
        chat_checks(c, a.kvrun, a.chat_model)
        queue_checks(c, a.kvrun, a.chat_model)
    error_checks(c, a.kvrun, a.tiny_model, a.quick)
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
