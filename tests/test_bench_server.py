"""`laststand bench` and `sweep` against our own server on the demo model (CPU).

Oracles: the server's own accounting (its usage fields and its Prometheus
counters laststand:generation_tokens_total / prompt_tokens_total), the
sglang.bench_serving metric definitions recomputed from the per-request
records, and for sweep the test-only broken MoE backends whose failure is known
(cpu_broken_nan -> NaN logits, cpu_broken_abort -> abort()).
"""
import json
import math
import os
import re
import subprocess
import time
import urllib.request

import pytest

from conftest import BIN, free_port, run_ls

METRICS = ["ttft", "tpot", "itl", "e2e_latency"]
STATS = ["mean", "median", "std", "p90", "p95", "p99", "max"]


@pytest.fixture(scope="module")
def server(ls_bin, demo_model, tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("serve") / "serve.log", "w")
    p = subprocess.Popen([BIN, "serve", "--model-path", demo_model, "--port", str(port)], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                break
        except Exception:
            if p.poll() is not None:
                pytest.fail(f"serve exited {p.returncode}: {open(log.name).read()[-2000:]}")
            time.sleep(0.1)
    yield url
    p.terminate()
    p.wait(30)


def counters(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = {}
    for name in ["generation_tokens_total", "prompt_tokens_total", "num_requests_total"]:
        m = re.search(r"^laststand:%s\{[^}]*\} (\d+)" % name, text, re.M)
        out[name] = int(m.group(1))
    return out


def check_level(l, n, out_len):
    for m in METRICS:
        for st in STATS:
            assert isinstance(l[f"{st}_{m}_ms"], float), f"{st}_{m}_ms"
    assert l["completed"] == n and l["failed"] == 0 and l["errors"] == []
    assert l["total_output_tokens"] == n * out_len  # ignore_eos + min_tokens hold the length
    assert l["server_usage"]["completion_tokens"] == l["total_output_tokens"]
    for k, tot in [("output_throughput", "total_output_tokens"), ("input_throughput", "total_input_tokens")]:
        assert math.isclose(l[k] * l["duration"], l[tot], rel_tol=1e-6)
    assert math.isclose(l["request_throughput"] * l["duration"], n, rel_tol=1e-6)
    det = l["details"]
    for d in det:
        assert d["ok"] and 0 < d["ttft_ms"] <= d["e2e_latency_ms"]
        assert d["completion_tokens"] == out_len
    assert l["itl_samples"] == sum(d["chunks"] - 1 for d in det)
    assert math.isclose(sum(d["e2e_latency_ms"] for d in det) / 1e3 / l["duration"], l["concurrency"], rel_tol=1e-6)
    tpots = [(d["e2e_latency_ms"] - d["ttft_ms"]) / (out_len - 1) for d in det]
    assert math.isclose(sum(tpots) / n, l["mean_tpot_ms"], rel_tol=1e-6)
    assert l["median_ttft_ms"] <= l["median_e2e_latency_ms"] and l["p99_ttft_ms"] <= l["max_ttft_ms"] + 1e-9


def test_bench_chat_two_levels_match_the_servers_own_counters(ls_bin, server, tmp_path):
    out, svg = tmp_path / "b.jsonl", tmp_path / "b.svg"
    before = counters(server)
    p = run_ls("bench", "--base-url", server, "--backend", "openai-chat", "--num-prompts", 4,
               "--random-input-len", 32, "--random-output-len", 8, "--random-range-ratio", 1,
               "--max-concurrency", "1,2", "--warmup-requests", 0, "--output-details",
               "--output-file", out, "--plot", svg, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    after = counters(server)
    lines = [json.loads(l) for l in open(out)]
    assert [l["max_concurrency"] for l in lines] == [1, 2]
    for l in lines:
        check_level(l, 4, 8)
        assert l["prompt_format"] == "text"
    # every generated and prompt token the server counted is in bench's totals, and nothing else
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == \
        sum(l["total_output_tokens"] for l in lines)
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == sum(l["total_input_tokens"] for l in lines)
    assert after["num_requests_total"] - before["num_requests_total"] == 8
    assert p.stdout.strip().splitlines()[-1].startswith("Headline: peak output throughput")
    assert os.path.getsize(svg) > 500


def test_bench_completions_send_token_ids_of_exact_length(ls_bin, server, tmp_path):
    out = tmp_path / "b.jsonl"
    p = run_ls("bench", "--base-url", server, "--backend", "openai", "--num-prompts", 4,
               "--random-input-len", 24, "--random-output-len", 6, "--random-range-ratio", 1,
               "--max-concurrency", "2,4", "--output-details", "--output-file", out, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    for l in map(json.loads, open(out)):
        check_level(l, 4, 6)
        assert l["prompt_format"] == "token_ids"
        assert l["total_input_tokens"] == l["drawn_input_tokens"] == 4 * 24


def test_sweep_over_cpu_moe_backends_and_broken_ones(ls_bin, demo_model, tmp_path):
    port = free_port()
    js = tmp_path / "s.json"
    env = dict(os.environ, LASTSTAND_TEST_BROKEN_BACKENDS="1")
    moes = ["cpu_ref", "cpu_grouped", "cpu_broken_nan", "cpu_broken_abort"]
    p = subprocess.run([BIN, "sweep", "--launch",
                        f"{BIN} serve --model-path {demo_model} --port {port} --moe-runner-backend {{moe}}",
                        "--grid", "moe=" + ",".join(moes), "--base-url", f"http://127.0.0.1:{port}",
                        "--health-timeout", "120", "--grace", "5", "--json", str(js),
                        "--num-prompts", "2", "--random-input-len", "16", "--random-output-len", "4",
                        "--max-concurrency", "2"], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    pts = {q["params"]["moe"]: q for q in json.loads(js.read_text())["points"]}
    assert pts["cpu_ref"]["verdict"] == "ok", pts["cpu_ref"]["evidence"]
    assert pts["cpu_grouped"]["verdict"] == "ok", pts["cpu_grouped"]["evidence"]
    for m in ["cpu_ref", "cpu_grouped"]:
        assert pts[m]["bench"][0]["completed"] == 2 and "tok/s" in pts[m]["evidence"]
    nan = pts["cpu_broken_nan"]
    # garbage (NaN surfaced as an error response), or a start-up refusal that says why
    assert nan["verdict"] in ("garbage", "crash"), nan
    if nan["verdict"] == "garbage":
        assert re.search(r"nan", nan["evidence"], re.I), nan["evidence"]
    else:
        assert "exit code" in nan["evidence"] and "cpu_broken_nan" in " ".join(nan["log_tail"])
    ab = pts["cpu_broken_abort"]
    assert ab["verdict"] == "crash", ab
    assert "SIGABRT" in ab["evidence"]
    rows = [l for l in p.stdout.splitlines() if l.startswith("| ")]
    assert len(rows) == 1 + len(moes)


def test_sweep_launch_that_cannot_start_is_a_crash_with_its_log_tail(ls_bin, demo_model, tmp_path):
    port = free_port()
    js = tmp_path / "s.json"
    p = run_ls("sweep", "--launch", f"{BIN} serve --model-path {demo_model} --port {port} --max-running-requests {{n}}",
               "--grid", "n=zero", "--base-url", f"http://127.0.0.1:{port}", "--health-timeout", 60, "--json", js,
               "--no-bench", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    [q] = json.loads(js.read_text())["points"]
    assert q["verdict"] == "crash" and "exit code 2" in q["evidence"]
    assert "--max-running-requests" in q["evidence"]  # the server's own complaint, from its log


def test_bench_draws_prompts_from_a_local_tokenizer(ls_bin, server, demo_model, tmp_path):
    """--tokenizer-path: ids from every regular token of tokenizer.json (HF tokenizers is the oracle for
    that count); --num-prompts as a list gives each level its own count."""
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(os.path.join(demo_model, "tokenizer.json"))
    special = {t.content for t in tk.get_added_tokens_decoder().values() if t.special}
    regular = [i for tok, i in tk.get_vocab(with_added_tokens=True).items() if tok not in special]
    out = tmp_path / "b.jsonl"
    p = run_ls("bench", "--base-url", server, "--tokenizer-path", demo_model, "--num-prompts", "2,5",
               "--max-concurrency", "1,3", "--random-input-len", 12, "--random-output-len", 4,
               "--random-range-ratio", 1, "--output-details", "--output-file", out, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(l) for l in open(out)]
    assert [l["num_prompts"] for l in lines] == [2, 5]
    assert [l["completed"] for l in lines] == [2, 5]
    for l in lines:
        assert l["vocab_source"] == "tokenizer-path" and l["vocab_pool_size"] == len(regular)
        assert l["total_output_tokens"] == 4 * l["completed"]
    # the 2 prompts of level 1 are the first 2 of level 2
    assert [d["prompt"] for d in lines[0]["details"]] == [d["prompt"] for d in lines[1]["details"][:2]]


def test_bench_times_a_server_without_tokenizer_through_logprobs(ls_bin, tmp_path):
    """synth: models have no tokenizer: prompts are ids below /get_model_info's vocab_size, and with
    logprobs asked for (--extra-request-body) every token's chunk is timed."""
    port = free_port()
    p = subprocess.Popen([BIN, "serve", "--model-path", "synth:demo", "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        info = json.loads(urllib.request.urlopen(url + "/get_model_info", timeout=5).read())
        out = tmp_path / "b.jsonl"
        r = run_ls("bench", "--base-url", url, "--backend", "openai", "--num-prompts", 3, "--random-input-len", 20,
                   "--random-output-len", 5, "--random-range-ratio", 1, "--extra-request-body", '{"logprobs": 0}',
                   "--output-file", out, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        l = json.loads(open(out).readline())
        assert l["vocab_source"] == "/get_model_info vocab_size" and l["vocab_pool_size"] == info["vocab_size"]
        assert l["prompt_format"] == "token_ids" and l["total_input_tokens"] == 60
        assert l["total_output_tokens"] == 15 and l["itl_samples"] == 3 * 4 and l["median_tpot_ms"] > 0
        # chat needs text: refused with the reason
        r = run_ls("bench", "--base-url", url, "--num-prompts", 1)
        assert r.returncode == 2 and "tokenize" in r.stderr
    finally:
        p.terminate()
        p.wait(30)


def test_run_e2e_script_produces_its_result_files(ls_bin, tmp_path):
    """bench/run_e2e.sh (the GPU benchmark) on the CPU with the demo preset and tiny sizes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PORT=str(free_port()), CONCURRENCY="1,2", NUM_PROMPTS="2,3", INPUT_LEN="16",
               OUTPUT_LEN="4", WARMUP="1", HEALTH_TIMEOUT="120", BIN=BIN)
    out = tmp_path / "e2e"
    r = subprocess.run(["bash", os.path.join(root, "bench", "run_e2e.sh"), str(out), "demo"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for f in ["bench.txt", "bench.jsonl", "bench.svg", "server.log", "metrics.txt", "meta.txt", "SUMMARY.md"]:
        assert (out / f).stat().st_size > 0, f
    lines = [json.loads(l) for l in open(out / "bench.jsonl")]
    assert [(l["max_concurrency"], l["num_prompts"], l["completed"]) for l in lines] == [(1, 2, 2), (2, 3, 3)]
    assert all(l["median_tpot_ms"] > 0 for l in lines)
    summary = (out / "SUMMARY.md").read_text()
    assert "| 1 | 2 | 2/0 |" in summary and "Headline:" in summary
    assert (out / "bench.txt").read_text().strip().splitlines()[-1].startswith("Headline:")


def test_bench_sends_the_api_key(ls_bin, demo_model, tmp_path):
    port = free_port()
    p = subprocess.Popen([BIN, "serve", "--model-path", demo_model, "--port", str(port), "--api-key", "sekrit"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        r = run_ls("bench", "--base-url", url, "--num-prompts", 1, "--random-input-len", 8, "--random-output-len", 2)
        assert r.returncode == 2 and "401" in r.stderr and "--api-key" in r.stderr
        out = tmp_path / "b.jsonl"
        r = run_ls("bench", "--base-url", url, "--api-key", "sekrit", "--num-prompts", 2, "--random-input-len", 8,
                   "--random-output-len", 2, "--random-range-ratio", 1, "--output-file", out)
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(open(out).readline())["completed"] == 2
        # a wrong key after discovery (given --model): every request fails with the server's 401 text
        r = run_ls("bench", "--base-url", url, "--api-key", "wrong", "--model", demo_model, "--tokenizer-path",
                   demo_model, "--num-prompts", 2, "--warmup-requests", 0, "--output-file", out)
        l = json.loads(open(out).readline())
        assert r.returncode == 1 and l["failed"] == 2 and l["errors"][0]["error"].startswith("HTTP 401")
    finally:
        p.terminate()
        p.wait(30)
