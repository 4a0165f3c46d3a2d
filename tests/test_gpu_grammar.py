"""Constrained decoding on the GPU engine (--device cuda, device sampling on):
with LASTSTAND_GRAMMAR_DEVICE=1 (S9) rows with a grammar mask or logit_bias
are sampled by the device sampler (their masks computed on the host before the
forward and staged with the step), checked through /metrics
(constrained_rows_device_total) and against a second server forced onto the
S8 host path (LASTSTAND_GRAMMAR_DEVICE=0: the step's logits come back and the
host sampler applies the mask): the same greedy tokens, logprobs within fp
tolerance. A random-weight synth model (real Qwen3.5 shapes, 8 layers)
with the demo tokenizer: unconstrained output is noise, so parsing and
validating outputs tests the mask. Raw HTTP and Python's json (the GPU machine
may lack the openai and jsonschema packages: jsonschema is used when present,
else the small validator below, which covers the keywords these schemas use).
test_tpot_constrained_vs_not prints the decode time per token of both kinds of
request (bench/device/grammar.sh collects it)."""
import json
import os
import threading

import pytest

from conftest import requires_gpu
from e2e_util import Server, chat_tpot

pytestmark = requires_gpu

MODEL_PATH = os.environ.get("LS_GRAMMAR_GPU_MODEL", "synth:qwen3.5-35b-a3b,layers=8")
EXTRA = os.environ.get("LS_GRAMMAR_GPU_FLAGS", "").split()  # e.g. --disable-cuda-graph (bench/device/grammar.sh)
# where the module's server samples constrained rows: 1 the device sampler (S9), 0 the host
GDEV = os.environ.get("LS_GRAMMAR_GPU_DEVICE", "1")

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


def _server(ls_bin, demo_model, gdev):
    # no prefix cache: a request that reuses cached pages prefills its suffix in another shape, so
    # its logits could differ in the last bits from the other server's full prefill (greedy ties)
    return Server(ls_bin, MODEL_PATH, "--tokenizer-path", demo_model, "--device", "cuda",
                  "--tool-call-parser", "qwen3_coder", "--max-running-requests", "8", "--prefix-cache", "off",
                  *EXTRA,
                  env={"LASTSTAND_GRAMMAR_DEVICE": gdev}, timeout=300)


@pytest.fixture(scope="module")
def srv(ls_bin, demo_model):
    with _server(ls_bin, demo_model, GDEV) as s:
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


def test_tpot_constrained_vs_not(srv):
    free = {"type": "json_schema", "json_schema": {"name": "t", "schema": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    chat_tpot(srv, 16)  # warm-up
    plain, n1 = chat_tpot(srv, 128)
    cons, n2 = chat_tpot(srv, 128, response_format=free)
    bias, n3 = chat_tpot(srv, 128, logit_bias={"300": 1})
    print(f"\nGRAMMAR_TPOT{' (' + ' '.join(EXTRA) + ')' if EXTRA else ''} unconstrained {plain * 1e3:.2f} ms ({n1} tok), json_schema {cons * 1e3:.2f} ms ({n2} tok), "
          f"logit_bias {bias * 1e3:.2f} ms ({n3} tok), constrained/unconstrained {cons / plain:.2f}x")
    assert n1 == n2 == n3 == 128


def _greedy_cases(srv):
    """Greedy constrained requests whose outputs both paths must reproduce exactly."""
    out = []
    c, _ = chat(srv, max_tokens=120, temperature=0, logprobs=True, top_logprobs=3,
                response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON,
                                                                         "strict": True}})
    out.append(("json_schema", c["message"]["content"], c["finish_reason"],
                [(t["token"], t["logprob"], [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
                 for t in c["logprobs"]["content"]]))
    c, _ = chat(srv, max_tokens=120, temperature=0, response_format={"type": "json_object"})
    out.append(("json_object", c["message"]["content"], c["finish_reason"], None))
    c, _ = chat(srv, max_tokens=200, temperature=0, tools=TOOLS, tool_choice="required")
    calls = [(t["function"]["name"], t["function"]["arguments"]) for t in c["message"].get("tool_calls") or []]
    out.append(("tool_choice required", calls, c["finish_reason"], None))  # not the ids: random per call
    st, o = srv.post_json("/generate", {"text": "The weather is", "sampling_params": {
        "max_new_tokens": 12, "temperature": 0, "logit_bias": {"300": 3.5, "17": -100, "42": 8}}})
    assert st == 200, o
    out.append(("logit_bias", o["output_ids"], None, None))
    return out


def test_constrained_rows_take_the_device_path_and_match_the_host_path(srv, ls_bin, demo_model):
    """The module's server (device path) and a host-path server give the same greedy outputs;
    /metrics says which sampler took the constrained rows. Logprobs: the device's fp32 exp
    against the host's fp64, within 1e-3."""
    if GDEV != "1":
        pytest.skip("the module's server is on the host path")
    d0, h0 = srv.metric("constrained_rows_device_total"), srv.metric("constrained_rows_host_total")
    dev = _greedy_cases(srv)
    d1, h1 = srv.metric("constrained_rows_device_total"), srv.metric("constrained_rows_host_total")
    print(f"\nGRAMMAR_DEVICE_ROWS device {d1 - d0} host {h1 - h0}")
    assert d1 - d0 >= 20 and h1 == h0, (d1 - d0, h1 - h0)
    with _server(ls_bin, demo_model, "0") as hs:
        host = _greedy_cases(hs)
        assert hs.metric("constrained_rows_device_total") == 0
        assert hs.metric("constrained_rows_host_total") >= 20
    for (name, a, fa, la), (_, b, fb, lb) in zip(dev, host):
        print(f"GRAMMAR_SAME {name}: {'yes' if (a, fa) == (b, fb) else 'NO'}: device {str(a)[:80]!r}")
        assert (a, fa) == (b, fb), (name, a, b)
        if la is not None:
            assert len(la) == len(lb)
            for (ta, pa, tops_a), (tb, pb, tops_b) in zip(la, lb):
                assert ta == tb and abs(pa - pb) < 1e-3, (ta, pa, tb, pb)
                assert [t for t, _ in tops_a] == [t for t, _ in tops_b], (tops_a, tops_b)
                for (_, x), (_, y) in zip(tops_a, tops_b):
                    assert abs(x - y) < 1e-3
    name, doc, fin, _ = dev[0]
    assert fin == "stop"
    validate(json.loads(doc), PERSON)


def test_mixed_batch_constrained_and_free_rows(srv):
    """Constrained and unconstrained requests in one batch: each constrained output validates,
    the free ones run to their length."""
    res, errs = {}, []

    def run(k):
        try:
            if k % 2:
                res[k] = chat(srv, max_tokens=200, temperature=0.8, seed=k,
                              response_format={"type": "json_schema", "json_schema": {
                                  "name": "p", "schema": PERSON, "strict": True}})[0]
            else:
                res[k] = chat(srv, max_tokens=40, min_tokens=40, ignore_eos=True, temperature=0.8, seed=k)[0]
        except Exception as e:  # noqa: BLE001 (reported below)
            errs.append(repr(e))
    ts = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    for k, c in res.items():
        if k % 2:
            assert c["finish_reason"] == "stop", c
            validate(json.loads(c["message"]["content"]), PERSON)
        else:
            assert c["finish_reason"] == "length", c
