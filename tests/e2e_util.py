"""Helpers for the end-to-end server tests: start `laststand serve` on a free
port, wait for /health, stop it, and small raw-HTTP helpers (for what the
OpenAI SDK cannot send: broken JSON, missing keys, oversized bodies)."""
import http.client
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from conftest import free_port


class Server:
    """A running `laststand serve`; use as a context manager."""

    def __init__(self, ls_bin, model_path, *flags, env=None, api_key=None, timeout=120):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.model_path = model_path
        args = [ls_bin, "serve", "--model-path", model_path, "--port", str(self.port), *map(str, flags)]
        if api_key:
            args += ["--api-key", api_key]
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=full_env)
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.log_text()}")
            try:
                if self.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise AssertionError(f"server not healthy after {timeout}s:\n{self.log_text()}")
            time.sleep(0.1)

    def log_text(self):
        self.log.seek(0)
        return self.log.read()[-6000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def headers(self, key=True):
        h = {"Content-Type": "application/json"}
        if key and self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def request(self, method, path, body=None, key=True, headers=None):
        """Raw HTTP; body is bytes, str or a JSON-able object. Returns (status, bytes)."""
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        req = urllib.request.Request(self.base + path, data=body, method=method,
                                     headers={**self.headers(key), **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get(self, path, key=True):
        return self.request("GET", path, key=key)

    def post(self, path, body, key=True):
        return self.request("POST", path, body, key=key)

    def post_json(self, path, body, key=True):
        status, data = self.post(path, body, key)
        return status, json.loads(data) if data else None

    def generate_greedy(self, ids, n):
        """/generate of exactly n greedy tokens after the ids: (output ids, cached_tokens)."""
        st, out = self.post_json("/generate", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
        assert st == 200, out
        return out["output_ids"], out["meta_info"]["cached_tokens"]

    def metrics(self):
        """/metrics' laststand: samples (histogram buckets aside), labels dropped: {name: value}."""
        out = {}
        for line in self.get("/metrics")[1].decode().splitlines():
            if line.startswith("laststand:") and "{" in line and "_bucket" not in line:
                out[line[len("laststand:"):line.index("{")]] = float(line.rsplit(" ", 1)[1])
        return out

    def metric(self, name, default=None):
        """One laststand: sample of /metrics by name (the last series of that name), as an int when
        it is whole; default when absent, or a failed assertion when no default is given."""
        m = self.metrics()
        if name not in m:
            assert default is not None, f"{name} not in /metrics"
            return default
        v = m[name]
        return int(v) if v == int(v) else v

    def tokenize(self, text):
        status, out = self.post_json("/tokenize", {"prompt": text})
        assert status == 200, out
        return out["tokens"]

    def oversized_post(self, path, length):
        """Announce a body of `length` bytes and wait for "100 Continue" as
        curl does: the server must answer 413 from the headers alone."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.putrequest("POST", path)
        for k, v in self.headers().items():
            c.putheader(k, v)
        c.putheader("Content-Length", str(length))
        c.putheader("Expect", "100-continue")
        c.endheaders()
        r = c.getresponse()
        status, data = r.status, r.read()
        c.close()
        return status, json.loads(data)


def chat_tpot(srv, n, seed=1, timeout=300, **kw):
    """Decode time per token of one streamed chat completion of exactly n tokens (min_tokens =
    max_tokens = n, ignore_eos, T 1.0, no thinking; kw adds to or overrides the body): seconds
    from the first chunk to the last over tokens - 1, and the tokens the usage chunk counts (0
    when none came)."""
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": False},
            "max_tokens": n, "min_tokens": n, "ignore_eos": True, "temperature": 1.0, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}, **kw}
    req = urllib.request.Request(srv.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers=srv.headers())
    t_first = t_last = None
    k = 0
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            now = time.time()
            if ev.get("choices"):
                t_first = t_first or now
                t_last = now
            if ev.get("usage"):
                k = ev["usage"]["completion_tokens"]
    return (t_last - t_first) / max(1, k - 1), k
