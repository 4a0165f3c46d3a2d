"""Constrained decoding on the GPU engine (--device cuda, device sampling on):
rows with a grammar or logit_bias are sampled on the host from logits brought
back for that step (engine_grammar.c), the other steps keep the device sampler
and CUDA graphs. A random-weight synth model (real Qwen3.5 shapes, 8 layers)
with the demo tokenizer: unconstrained output is noise, so parsing and
validating outputs tests the mask. Raw HTTP and Python's json (the GPU machine
may lack the openai and jsonschema packages: jsonschema is used when present,
else the small validator below, which covers the keywords these schemas use).
test_tpot_constrained_vs_not prints the decode time per token of both kinds of
request (bench/device/grammar.sh collects it)."""
import json
import os
import time
import urllib.request

import pytest

from conftest import requires_gpu
from e2e_util import Server

pytestmark = requires_gpu

MODEL_PATH = os.environ.get("LS_GRAMMAR_GPU_MODEL", "synth:qwen3.5-35b-a3b,layers=8")
EXTRA = os.environ.get("LS_GRAMMAR_GPU_FLAGS", "").split()  # e.g. --disable-cuda-graph (bench/device/grammar.sh)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["name", "color", "ok"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}, "exact": {"type": "boolean"}},
    "required": ["tz", "exact"]}}}]
NO_THINK = {"enable_thinking": False}


def validate(doc, s):
    try:
        import jsonschema
        jsonschema.validate(doc, s)
        return
    except ImportError:
        pass
    if "enum" in s:
        assert doc in s["enum"], (doc, s)
        return
    t = s.get("type")
    if t == "object":
        assert isinstance(doc, dict), doc
        for k in s.get("required", []):
            assert k in doc, (k, doc)
        for k, v in doc.items():
            assert k in s["properties"] or s.get("additionalProperties", True) is not False, k
            if k in s["properties"]:
                validate(v, s["properties"][k])
    elif t == "array":
        assert isinstance(doc, list) and len(doc) <= s.get("maxItems", 1 << 30), doc
        for x in doc:
            validate(x, s["items"])
    elif t == "string":
        assert isinstance(doc, str) and s.get("minLength", 0) <= len(doc) <= s.get("maxLength", 1 << 30), doc
    elif t == "boolean":
        assert isinstance(doc, bool), doc
    else:
        raise AssertionError(f"validator: {s}")


@pytest.fixture(scope="module")
def srv(ls_bin, demo_model):
    with Server(ls_bin, MODEL_PATH, "--tokenizer-path", demo_model, "--device", "cuda",
                "--tool-call-parser", "qwen3_coder", "--max-running-requests", "8", *EXTRA, timeout=300) as s:
        yield s


def chat(srv, **kw):
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": NO_THINK, **kw}
    status, out = srv.post_json("/v1/chat/completions", body)
    assert status == 200, out
    return out["choices"][0], out["usage"]


def test_json_schema_on_device_engine(srv):
    for seed in (1, 2, 3):
        c, _ = chat(srv, max_tokens=300, temperature=1.0, seed=seed,
                    response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON,
                                                                             "strict": True}})
        assert c["finish_reason"] == "stop", c
        validate(json.loads(c["message"]["content"]), PERSON)


def test_tool_choice_named_on_device_engine(srv):
    c, _ = chat(srv, max_tokens=300, temperature=1.0, seed=4, tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert c["finish_reason"] == "tool_calls", c
    (call,) = c["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time"
    validate(json.loads(call["function"]["arguments"]), TOOLS[0]["function"]["parameters"])


def test_logit_bias_on_device_engine(srv):
    def first(**sp):
        st, out = srv.post_json("/generate", {"text": "The weather is", "sampling_params": {
            "max_new_tokens": 3, "temperature": 0, **sp}})
        assert st == 200, out
        return out["output_ids"]
    g = first()
    assert first(logit_bias={str(g[0]): -100})[0] != g[0]
    assert first(temperature=1.0, seed=2, logit_bias={"300": 100}) == [300, 300, 300]


def _tpot(srv, n, **kw):
    """Seconds per token after the first, from the stream's first and last chunk."""
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": NO_THINK, "max_tokens": n,
            "min_tokens": n, "ignore_eos": True, "temperature": 1.0, "seed": 1, "stream": True,
            "stream_options": {"include_usage": True}, **kw}
    req = urllib.request.Request(srv.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t_first = t_last = None
    usage = None
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            now = time.time()
            if ev.get("choices"):
                t_first = t_first or now
                t_last = now
            if ev.get("usage"):
                usage = ev["usage"]
    k = usage["completion_tokens"]
    return (t_last - t_first) / max(1, k - 1), k


def test_tpot_constrained_vs_not(srv):
    free = {"type": "json_schema", "json_schema": {"name": "t", "schema": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    _tpot(srv, 16)  # warm-up
    plain, n1 = _tpot(srv, 128)
    cons, n2 = _tpot(srv, 128, response_format=free)
    bias, n3 = _tpot(srv, 128, logit_bias={"300": 1})
    print(f"\nGRAMMAR_TPOT{' (' + ' '.join(EXTRA) + ')' if EXTRA else ''} unconstrained {plain * 1e3:.2f} ms ({n1} tok), json_schema {cons * 1e3:.2f} ms ({n2} tok), "
          f"logit_bias {bias * 1e3:.2f} ms ({n3} tok), constrained/unconstrained {cons / plain:.2f}x")
    assert n1 == n2 == n3 == 128
