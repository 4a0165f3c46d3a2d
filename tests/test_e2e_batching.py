"""Batching through the whole server never changes results (issue 4,
acceptance): 64 concurrent streaming greedy requests with different prompts
and lengths return exactly what each returns alone, with a KV cache far too
small for all of them at once (--max-total-tokens 384 = 24 pages), and every
page is free afterwards. The oracle is the same server answering the same
request on its own (greedy decoding is deterministic)."""
import json
import os
import threading

import pytest

openai = pytest.importorskip("openai")

from e2e_util import Server  # noqa: E402

N = 64


def requests():
    out = []
    for i in range(N):
        prompt = f"Request {i}: " + " ".join(f"w{(i * 7 + k) % 50}" for k in range((i * 5) % 23))
        out.append(dict(prompt=prompt, max_tokens=6 + (i * 5) % 19))
    return out


def stream_text(client, req):
    text, finish, usage = "", None, None
    for c in client.completions.create(model="demo", temperature=0, stream=True,
                                       stream_options={"include_usage": True}, **req):
        if c.choices:
            text += c.choices[0].text
            finish = c.choices[0].finish_reason or finish
        if c.usage:
            usage = (c.usage.prompt_tokens, c.usage.completion_tokens)
    return text, finish, usage


def metric(srv, name):
    for line in srv.get("/metrics")[1].decode().splitlines():
        if line.startswith("laststand:" + name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)


def test_64_concurrent_streams_match_solo_runs_under_kv_pressure(ls_bin, request):
    model = "synth:demo" if os.environ.get("LASTSTAND_E2E_BIN") else request.getfixturevalue("demo_model")
    with Server(os.environ.get("LASTSTAND_E2E_BIN", ls_bin), model, "--served-model-name", "demo",
                "--max-total-tokens", "384", "--max-running-requests", "64") as srv:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0, timeout=300)
        reqs = requests()
        solo = [stream_text(client, r) for r in reqs]
        assert all(f == "length" and u[1] == r["max_tokens"] for (t, f, u), r in zip(solo, reqs))

        results = [None] * N
        errors = []

        def run(i):
            try:
                results[i] = stream_text(client, reqs[i])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"request {i}: {e!r}")

        threads = [threading.Thread(target=run, args=(i,)) for i in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        for i in range(N):
            assert results[i] == solo[i], f"request {i}: batched {results[i]!r} != alone {solo[i]!r}"
        assert metric(srv, "num_running_reqs") == 0
        assert metric(srv, "kv_pages_used") == 0
        info = json.loads(srv.get("/get_server_info")[1])
        print(f"preemptions: {metric(srv, 'preemptions_total'):.0f}, KV tokens {info['max_total_tokens']}")
