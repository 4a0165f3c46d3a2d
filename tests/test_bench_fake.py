"""`laststand bench` against a scripted OpenAI-compatible server whose timings and
token accounting are known exactly (the oracle), so every metric can be checked
against its sglang.bench_serving definition.

The same file is the scripted server: `python3 test_bench_fake.py serve --port P
--mode M [...]` (used by test_sweep_fake.py too). Its tokenizer is one token per
character (id = code point), so a prompt's token count is its length; each
generated token is one SSE chunk, the first after --ttft seconds, the next ones
--tpot seconds apart; usage reports exactly what was generated.
"""
import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.abspath(__file__)

# ---------------------------------------------------------------------------------------
# the scripted server
# ---------------------------------------------------------------------------------------

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def make_handler(args, state):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def send_json(self, code, obj, raw=None):
            body = raw if raw is not None else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                if args.mode == "hang":
                    return self.send_json(503, {"error": {"message": "still loading"}})
                return self.send_json(200, {})
            if self.path == "/v1/models":
                return self.send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            if self.path == "/arrivals":
                with state["lock"]:
                    return self.send_json(200, {"arrivals": list(state["arrivals"])})
            return self.send_json(404, {"error": {"message": "no route " + self.path}})

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0"))
            req = json.loads(self.rfile.read(n) or b"{}")
            if self.path == "/tokenize":
                return self.send_json(200, {"tokens": [ord(c) for c in req["prompt"]]})
            if self.path == "/detokenize":
                return self.send_json(200, {"text": "".join(chr(i) for i in req["tokens"])})
            chat = self.path == "/v1/chat/completions"
            if not chat and self.path != "/v1/completions":
                return self.send_json(404, {"error": {"message": "no route"}})
            with state["lock"]:
                state["count"] += 1
                k = state["count"]
                state["arrivals"].append(time.monotonic())
            if chat:
                prompt = "".join(m["content"] for m in req["messages"])
                n_prompt = len(prompt)
            else:
                p = req["prompt"]
                n_prompt = len(p)
                prompt = p if isinstance(p, str) else "".join(chr(i) for i in p)
            if args.mode == "die":
                os._exit(9)
            if args.fail_every and k % args.fail_every == 0:
                return self.send_json(500, {"error": {"message": f"boom {k}", "type": "internal"}})
            if args.mode == "nan":
                return self.send_json(500, {"error": {"message": "NaN in logits at step 0"}})
            n_out = int(req.get("max_tokens", 16))
            if args.mode == "answer":  # the given text, then the prompt's first word (answers differ)
                toks = [args.answer, " " + prompt.split()[0]]
            elif args.mode == "bang":
                toks = ["!!"] * n_out
            elif args.mode == "empty":
                toks = [""] * n_out
            elif args.mode == "same":
                toks = [WORDS[i % len(WORDS)] + " " for i in range(n_out)]
            else:  # a different, varied answer per prompt
                h = hashlib.sha256(prompt.encode()).digest()
                toks = [WORDS[(h[i % 32] + i // 32) % len(WORDS)] + " " for i in range(n_out)]
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

            def choice(text, fin=None):
                if chat:
                    return {"index": 0, "delta": {"content": text}, "finish_reason": fin}
                return {"index": 0, "text": text, "finish_reason": fin}

            if not req.get("stream"):
                time.sleep(args.ttft + args.tpot * (n_out - 1))
                text = "".join(toks)
                if args.mode == "badutf8":
                    raw = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "@@T@@"},
                                                   "finish_reason": "length"}], "usage": usage}).encode()
                    return self.send_json(200, None, raw.replace(b"@@T@@", b"caf\xe9 \xff\xfe"))
                c = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                     if chat else {"index": 0, "text": text, "finish_reason": "length"})
                return self.send_json(200, {"id": "x", "choices": [c], "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            time.sleep(args.ttft)
            for i, t in enumerate(toks):
                if i:
                    time.sleep(args.tpot)
                ev = {"id": "x", "choices": [choice(t, "length" if i == n_out - 1 else None)]}
                self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                self.wfile.flush()
            if args.mode != "nousage":
                self.wfile.write(b"data: " + json.dumps({"id": "x", "choices": [], "usage": usage}).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return H


def serve(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="ok")
    ap.add_argument("--ttft", type=float, default=0.05)
    ap.add_argument("--tpot", type=float, default=0.01)
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--banner", default="")
    ap.add_argument("--answer", default="", help="mode answer: the text of every answer")
    ap.add_argument("--pidfile", default="")
    ap.add_argument("--child", action="store_true", help="also start a long-lived child process")
    args = ap.parse_args(argv)
    print("fake server argv:", json.dumps(sys.argv[1:]), flush=True)
    if args.banner:
        print("banner:", args.banner, flush=True)
    if args.pidfile:
        pids = [os.getpid()]
        if args.child:
            pids.append(subprocess.Popen(["sleep", "1000"]).pid)
        with open(args.pidfile, "w") as f:
            f.write(" ".join(map(str, pids)))
    if args.mode == "exit3":
        print("fatal: cannot load model: no such file weights.bin", flush=True)
        sys.exit(3)
    if args.mode == "abort":
        print("about to abort", flush=True)
        os.abort()
    state = {"lock": threading.Lock(), "count": 0, "arrivals": []}
    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # the default backlog of 5 drops bursts of connections

    srv = Server(("127.0.0.1", args.port), make_handler(args, state))
    srv.daemon_threads = True
    srv.serve_forever()


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "serve":
    serve(sys.argv[2:])
    sys.exit(0)

# ---------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------

import xml.etree.ElementTree as ET  # noqa: E402

import pytest  # noqa: E402

from conftest import free_port, run_ls  # noqa: E402


class FakeServer:
    def __init__(self, *extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.p = subprocess.Popen([sys.executable, HERE, "serve", "--port", str(self.port), *map(str, extra)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import urllib.request
        for _ in range(200):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except Exception:
                time.sleep(0.05)
        raise RuntimeError("fake server did not start")

    def get(self, path):
        import urllib.request
        return json.loads(urllib.request.urlopen(self.url + path, timeout=5).read())

    def close(self):
        self.p.terminate()
        self.p.wait(10)


@pytest.fixture
def fake(request):
    servers = []

    def start(*extra):
        s = FakeServer(*extra)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def bench(ls_bin, url, out, *flags, check=True):
    p = run_ls("bench", "--base-url", url, "--output-file", out, *flags, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(l) for l in open(out)] if os.path.exists(out) else []
    return p, lines


METRICS = ["ttft", "tpot", "itl", "e2e_latency"]
STATS = ["mean", "median", "std", "p90", "p95", "p99", "max"]


def test_bench_metrics_follow_sglang_definitions_on_a_known_server(ls_bin, fake, tmp_path):
    """TTFT, TPOT, ITL, e2e, throughputs and concurrency against a server with a
    known 50 ms TTFT and 10 ms per token; token totals equal the server's usage."""
    s = fake("--ttft", 0.05, "--tpot", 0.01)
    out = str(tmp_path / "b.jsonl")
    p, lines = bench(ls_bin, s.url, out, "--backend", "openai-chat", "--num-prompts", 8,
                     "--random-input-len", 40, "--random-output-len", 12, "--random-range-ratio", 1.0,
                     "--max-concurrency", "1,4", "--output-details", "--seed", 7)
    assert len(lines) == 2
    assert [l["max_concurrency"] for l in lines] == [1, 4]
    for l in lines:
        for m in METRICS:
            for st in STATS:
                assert f"{st}_{m}_ms" in l, f"{st}_{m}_ms missing"
        assert l["completed"] == 8 and l["failed"] == 0 and l["errors"] == []
        # the server's usage: 12 tokens per request, prompt = drawn length (1 char = 1 token)
        assert l["total_output_tokens"] == 8 * 12 == l["server_usage"]["completion_tokens"]
        assert l["total_input_tokens"] == 8 * 40 == l["drawn_input_tokens"]
        assert math.isclose(l["output_throughput"] * l["duration"], l["total_output_tokens"], rel_tol=1e-6)
        assert math.isclose(l["input_throughput"] * l["duration"], l["total_input_tokens"], rel_tol=1e-6)
        assert math.isclose(l["request_throughput"] * l["duration"], 8, rel_tol=1e-6)
        assert math.isclose(l["total_token_throughput"], l["input_throughput"] + l["output_throughput"], rel_tol=1e-6)
        # 50 ms to the first token, 10 ms per token after it (slack for a loaded 2-core CI machine)
        assert 45 <= l["median_ttft_ms"] < 250
        assert 9 <= l["median_tpot_ms"] < 40
        assert 5 <= l["median_itl_ms"] < 40
        assert l["itl_samples"] == 8 * 11  # one gap per chunk after the first
        assert l["median_ttft_ms"] <= l["median_e2e_latency_ms"]
        assert l["p99_e2e_latency_ms"] >= l["median_e2e_latency_ms"] >= l["median_ttft_ms"]
        assert l["p90_ttft_ms"] <= l["p99_ttft_ms"] <= l["max_ttft_ms"]
        det = l["details"]
        assert len(det) == 8
        for d in det:
            assert d["ok"] and d["completion_tokens"] == 12 and d["chunks"] == 12
            assert d["ttft_ms"] <= d["e2e_latency_ms"]
        # concurrency = sum(e2e) / duration
        conc = sum(d["e2e_latency_ms"] for d in det) / 1e3 / l["duration"]
        assert math.isclose(conc, l["concurrency"], rel_tol=1e-6)
        # TPOT of each request = (e2e - ttft) / (tokens - 1); the mean over requests is mean_tpot
        tpots = [(d["e2e_latency_ms"] - d["ttft_ms"]) / 11 for d in det]
        assert math.isclose(sum(tpots) / 8, l["mean_tpot_ms"], rel_tol=1e-6)
    c1, c4 = lines
    assert c1["concurrency"] <= 1.0 + 1e-6
    assert c4["concurrency"] > 1.5
    assert c4["output_throughput"] > c1["output_throughput"] * 1.5
    # stdout: one table per level, then the sweep summary whose last line is the headline
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("Headline: peak output throughput")
    assert p.stdout.count("Serving Benchmark Result") == 2


def test_bench_random_lengths_follow_sglang_range_ratio(ls_bin, fake, tmp_path):
    """input ~ U[max(1, int(I*r)), I], output ~ U[int(O*r), O]; the same seed gives the same prompts."""
    s = fake("--ttft", 0.0, "--tpot", 0.0)
    out = str(tmp_path / "b.jsonl")
    _, [l] = bench(ls_bin, s.url, out, "--backend", "openai", "--num-prompts", 40, "--random-input-len", 50,
                   "--random-output-len", 20, "--random-range-ratio", 0.5, "--output-details", "--seed", 3)
    ins = [d["prompt_len"] for d in l["details"]]
    outs = [d["output_len"] for d in l["details"]]
    assert all(25 <= x <= 50 for x in ins) and len(set(ins)) > 5
    assert all(10 <= x <= 20 for x in outs) and len(set(outs)) > 3
    # completions take token ids here: the server counts exactly the drawn ids
    assert l["prompt_format"] == "token_ids"
    assert l["total_input_tokens"] == sum(ins) == l["drawn_input_tokens"]
    assert l["total_output_tokens"] == sum(outs)
    _, [l2] = bench(ls_bin, s.url, out, "--backend", "openai", "--num-prompts", 40, "--random-input-len", 50,
                    "--random-output-len", 20, "--random-range-ratio", 0.5, "--output-details", "--seed", 3)
    assert [d["prompt"] for d in l2["details"]] == [d["prompt"] for d in l["details"]]


def test_bench_counts_failed_requests_with_their_error_text(ls_bin, fake, tmp_path):
    s = fake("--fail-every", 3, "--ttft", 0.0, "--tpot", 0.001)
    out = str(tmp_path / "b.jsonl")
    p, [l] = bench(ls_bin, s.url, out, "--num-prompts", 9, "--random-input-len", 8, "--random-output-len", 4,
                   "--random-range-ratio", 1, "--warmup-requests", 0, "--max-concurrency", 1)
    assert l["completed"] == 6 and l["failed"] == 3
    errs = {e["error"]: e["count"] for e in l["errors"]}
    assert sum(errs.values()) == 3
    assert all(k.startswith("HTTP 500: boom ") for k in errs)
    assert "Failed requests:                         3" in p.stdout
    assert "HTTP 500: boom 3" in p.stdout
    assert l["total_output_tokens"] == 6 * 4


def test_bench_never_guesses_tokens_when_the_stream_has_no_usage(ls_bin, fake, tmp_path):
    s = fake("--mode", "nousage", "--ttft", 0.0, "--tpot", 0.0)
    out = str(tmp_path / "b.jsonl")
    p, lines = bench(ls_bin, s.url, out, "--num-prompts", 2, "--random-input-len", 8, "--random-output-len", 4,
                     "--warmup-requests", 0, check=False)
    assert p.returncode == 1
    assert lines[0]["completed"] == 0 and lines[0]["failed"] == 2
    assert "no usage" in lines[0]["errors"][0]["error"]
    # non-streaming responses carry usage: that works
    p, [l] = bench(ls_bin, s.url, out, "--num-prompts", 2, "--random-input-len", 8, "--random-output-len", 4,
                   "--random-range-ratio", 1, "--disable-stream")
    assert l["completed"] == 2 and l["total_output_tokens"] == 8 and l["stream"] is False
    assert l["median_ttft_ms"] == l["median_e2e_latency_ms"]  # non-streaming: TTFT = latency


def test_bench_poisson_arrivals_at_the_requested_rate(ls_bin, fake, tmp_path):
    s = fake("--ttft", 0.0, "--tpot", 0.0)
    out = str(tmp_path / "b.jsonl")
    bench(ls_bin, s.url, out, "--num-prompts", 30, "--random-input-len", 4, "--random-output-len", 2,
          "--request-rate", 20, "--warmup-requests", 0)
    t = s.get("/arrivals")["arrivals"]
    assert len(t) == 30
    gaps = [b - a for a, b in zip(t, t[1:])]
    mean = sum(gaps) / len(gaps)
    assert 0.02 < mean < 0.12, mean  # 1/rate = 50 ms, exponential gaps
    assert max(gaps) > 2 * min(gaps)  # not a fixed pace
    # inf: everything at once
    s2 = fake("--ttft", 0.2, "--tpot", 0.0)
    bench(ls_bin, s2.url, out, "--num-prompts", 10, "--random-input-len", 4, "--random-output-len", 2,
          "--warmup-requests", 0)
    t = s2.get("/arrivals")["arrivals"]
    assert max(t) - min(t) < 0.15


def test_bench_plot_is_an_svg_with_one_point_per_level(ls_bin, fake, tmp_path):
    s = fake("--ttft", 0.0, "--tpot", 0.002)
    out, svg = str(tmp_path / "b.jsonl"), str(tmp_path / "p.svg")
    bench(ls_bin, s.url, out, "--num-prompts", 6, "--random-input-len", 8, "--random-output-len", 6,
          "--max-concurrency", "1,2,3", "--plot", svg)
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    lines = [e for e in root.iter() if e.tag.endswith("polyline")]
    assert len(lines) == 2
    for pl in lines:
        assert len(pl.get("points").split()) == 3
    text = " ".join(e.text or "" for e in root.iter() if e.tag.endswith("text"))
    assert "output throughput" in text and "TPOT" in text and "concurrency" in text


def test_bench_rejects_bad_flags_with_exit_2(ls_bin):
    for flags, word in [(["--num-prompts", "4"], "--base-url"),
                        (["--base-url", "http://127.0.0.1:1", "--max-concurrency", "1,x"], "--max-concurrency"),
                        (["--base-url", "http://127.0.0.1:1", "--backend", "grpc"], "--backend"),
                        (["--base-url", "http://127.0.0.1:1", "--random-range-ratio", "1.5"], "--random-range-ratio"),
                        (["--base-url", "127.0.0.1:1"], "--base-url"),
                        (["--base-url", "http://127.0.0.1:1", "--bogus"], "--bogus")]:
        p = run_ls("bench", *flags)
        assert p.returncode == 2, (flags, p.stderr)
        assert word in p.stderr
    # a server that is not there: runtime failure naming the URL, exit 1
    p = run_ls("bench", "--base-url", f"http://127.0.0.1:{free_port()}", "--num-prompts", "1")
    assert p.returncode in (1, 2) and "/v1/models" in p.stderr
