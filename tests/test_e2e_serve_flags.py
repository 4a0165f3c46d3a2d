"""`laststand serve` flags: bad input exits 2 naming the flag before anything
loads (DESIGN.md section 2), SGLang launch lines are accepted, and a full
admission queue answers 503 while the server keeps serving."""
import json
import os
import threading

import pytest

from conftest import run_ls
from e2e_util import Server

openai = pytest.importorskip("openai")


@pytest.mark.parametrize("args, needle", [
    (["--bogus-flag", "1"], "--bogus-flag"),
    (["--port", "abc"], "--port"),
    (["--port", "70000"], "--port"),
    (["--tool-call-parser", "hermes"], "--tool-call-parser"),
    (["--reasoning-parser", "deepseek"], "--reasoning-parser"),
    (["--nnodes", "2"], "multi-node"),
    (["--mem-fraction-static", "1.5"], "--mem-fraction-static"),
    (["--model-path", "/nonexistent/model"], "/nonexistent/model"),
    (["--tp"], "--tp needs a value"),
    (["positional"], "positional"),
    (["--mamba-ssm-dtype", "float16"], "--mamba-ssm-dtype"),
])
def test_bad_flags_exit_2_naming_them(ls_bin, args, needle):
    p = run_ls("serve", *args, timeout=60)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr


def test_help_lists_sglang_flags(ls_bin):
    p = run_ls("serve", "--help", timeout=60)
    assert p.returncode == 0
    for f in ("--model-path", "--served-model-name", "--tp", "--reasoning-parser", "--tool-call-parser",
              "--disable-custom-all-reduce", "--mem-fraction-static", "--chunked-prefill-size", "--api-key",
              "--attention-backend", "--moe-runner-backend", "--fp4-gemm-backend", "--gemm-backend",
              "--gdn-backend", "--lm-head-backend", "--dist-init-addr", "--mamba-ssm-dtype"):
        assert f in p.stdout


def test_sglang_style_launch_line_and_full_queue_gives_503(ls_bin, demo_model):
    with Server(ls_bin, demo_model, "--served-model-name", "q", "--tp", "1", "--host", "127.0.0.1",
                "--attention-backend", "auto", "--disable-custom-all-reduce", "--log-level", "warning",
                "--max-running-requests", "1", "--max-queued-requests", "1", "--chunked-prefill-size", "512",
                "--reasoning-parser=qwen3", "--tool_call_parser", "qwen3_coder", "--enable-metrics",
                "--trust-remote-code") as s:
        info = json.loads(s.get("/get_server_info")[1])
        assert info["max_running_requests"] == 1 and info["chunked_prefill_size"] == 512
        statuses = []
        lock = threading.Lock()

        def one():
            st, body = s.post("/v1/completions", {"prompt": "x", "max_tokens": 300, "ignore_eos": True})
            with lock:
                statuses.append((st, json.loads(body)))

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        codes = sorted(st for st, _ in statuses)
        assert 200 in codes and 503 in codes, codes
        busy = [b for st, b in statuses if st == 503][0]
        assert "queue is full" in busy["error"]["message"]
        assert s.post("/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200


def test_bf16_gdn_state_serves_through_the_start_up_checks(ls_bin, demo_model):
    """--mamba-ssm-dtype bfloat16: the start-up doctor's gdn trials and the smoke test run on the
    BF16 state (the smoke children get the flag), then the server answers the OpenAI SDK."""
    with Server(ls_bin, demo_model, "--mamba-ssm-dtype", "bfloat16") as s:
        client = openai.OpenAI(base_url=f"{s.base}/v1", api_key="x")
        r = client.completions.create(model=demo_model, prompt="Hello", max_tokens=6, temperature=0)
        assert r.usage.completion_tokens >= 1 and r.choices[0].text is not None
        log = s.log_text()
        assert "GDN recurrent state in BF16" in log, log
        assert "smoke test" in log, log
