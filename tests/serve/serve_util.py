"""Shared by the kvrun serve tests: start a server on 127.0.0.1 (any free
port), talk to it raw (status codes, headers, broken requests) or through
the official openai client, read its metrics, stop it."""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time


class Server:
    """`kvrun serve` on 127.0.0.1:0; the port is read from its stderr."""

    def __init__(self, kvrun, model, *args, ready_timeout=120):
        self.cmd = [kvrun, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", *args]
        key = args[args.index("--api-key") + 1] if "--api-key" in args else None
        self.auth = {"Authorization": f"Bearer {key}"} if key else {}
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, errors="replace")
        self.log = []
        self.port = None
        got_port = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    got_port.set()
            got_port.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not got_port.wait(ready_timeout) or self.port is None:
            self.kill()
            raise AssertionError("kvrun serve did not listen:\n" + "".join(self.log))
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            status, _, _ = self.request("GET", "/health")
            if status == 200:
                return
            assert status == 503, status
            time.sleep(0.05)
        self.kill()
        raise AssertionError("kvrun serve never became ready:\n" + "".join(self.log))

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers, parsed JSON body or text)"""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
            conn.request(method, path, body=data, headers=headers or {})
            r = conn.getresponse()
            raw = r.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            return r.status, dict(r.getheaders()), parsed
        except ConnectionRefusedError:
            return None, {}, None
        finally:
            conn.close()

    def metrics(self):
        status, _, text = self.request("GET", "/metrics", headers=self.auth)
        assert status == 200, status
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_idle(self, timeout=10):
        """Until no sequence runs or waits and no KV block is held."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if (m["kvrun_requests_running"] == 0 and m["kvrun_requests_waiting"] == 0
                    and m["kvrun_kv_blocks_used"] == 0):
                return m
            if time.time() > deadline:
                raise AssertionError(f"not idle after {timeout} s: {m}")
            time.sleep(0.05)

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def terminate(self, timeout=30):
        """SIGTERM; returns the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"kvrun serve did not stop within {timeout} s after SIGTERM")
        self.reader.join(5)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def raw_exchange(port, data, timeout=10, shut_write=False):
    """Bytes to the port as they are (a broken request); what came back."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if shut_write:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def lone_run(kvrun, model, prompt, n, ctx, threads, extra=()):
    """What `kvrun -p` prints for the prompt, greedy."""
    r = subprocess.run([kvrun, "-m", model, "-p", prompt, "-n", str(n), "--temp", "0",
                        "-c", str(ctx), "-t", str(threads), *extra],
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode("utf-8")


class Checks:
    """Named checks; a failure is printed and counted, the rest go on."""

    def __init__(self):
        self.failed = []
        self.passed = 0

    def run(self, name, fn, *args):
        t0 = time.time()
        try:
            fn(*args)
            self.passed += 1
            print(f"ok   {name} ({time.time() - t0:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 -- report every failure, go on
            import traceback
            self.failed.append(name)
            print(f"FAIL {name}: {e!r}", flush=True)
            traceback.print_exc()

    def finish(self):
        print(f"{self.passed} passed, {len(self.failed)} failed" +
              (": " + ", ".join(self.failed) if self.failed else ""), flush=True)
        return 1 if self.failed else 0


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def env_threads():
    return int(os.environ.get("KVRUN_SERVE_THREADS", "2"))


if __name__ == "__main__":
    sys.exit("a helper module: run test_serve.py")
