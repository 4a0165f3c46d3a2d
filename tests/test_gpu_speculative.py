"""Speculative decoding on a GPU (skipped without one): `serve --device cuda --speculative-algorithm
ngram`. A step with drafts runs eagerly with a logits row per position (logits_all), samples on
the host, and rolls the GDN state back through in-step snapshots: device-to-device copies into the
request's spare slots between the GDN op's pieces; the other steps keep the CUDA graphs.

Pins:
- the fixture models (qwen3: pure attention; qwen3_5_moe_text, qwen3_next: GDN): greedy /generate
  with drafts keeps at least 10 of transformers' 12 ids where the same server without drafts does
  (the CUDA BF16 bar of issue 5), alone and beside 7 concurrent requests;
- the demo model, 6 chat requests with a forced repeating prefix then free tokens: ids equal to a
  server without drafts up to the first near tie (a verify step of k + 1 rows rounds its BF16
  GEMMs differently from k one-row steps, and the KV and GDN state it writes carry that rounding
  into later steps, so a free token may flip where the top two logprobs are within 2 x LP_TOL:
  each side's logprobs may be LP_TOL off; S27 saw a flip at a margin of 0.25, 35 free tokens in;
  before that point every token must match), and every forced token's logprob within LP_TOL
  (0.25) of it; drafts accepted in full, in part and not at all (/metrics).
"""
import concurrent.futures as cf
import json
import os
import random

import pytest

from conftest import SHARED, requires_gpu
from e2e_util import Server

pytestmark = requires_gpu

MODELS = os.path.join(SHARED, "fixtures", "models")
FAST = ["--doctor-buckets", "1,64", "--max-running-requests", "8", "--cuda-graph-max-bs", "8"]
SPEC = ["--speculative-algorithm", "ngram", "--speculative-ngram-min-match-window-size", "1"]
# a forced token is often far down the distribution (logprob -10), where a verify step's BF16 GEMMs
# (k + 1 rows) and a decode step's (one row) round the logits apart: 0.06 was seen at -9.6 (S27);
# test_gpu_prefix_cache.py allows 0.4 for a changed prefill cut
LP_TOL = 0.25
NO_ADAPT = {"LASTSTAND_SPEC_ADAPT": "0"}  # draft whenever a match exists (the mechanics, not the cost model)


def load_ref(name):
    d = os.path.join(MODELS, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        pytest.skip(f"{d} missing")
    with open(os.path.join(d, "ref.json")) as f:
        return d, json.load(f)


def same(a, b):
    return sum(x == y for x, y in zip(a, b))


@pytest.mark.parametrize("name,n_draft", [("qwen3", 9), ("qwen3_5_moe_text", 5), ("qwen3_next", 5)])
def test_fixture_greedy_with_drafts_on_cuda(ls_bin, name, n_draft):
    d, ref = load_ref(name)
    prompts = [ref["input_ids"][i:] + ref["input_ids"][:i] for i in range(8)]
    got = {}
    for label, flags in (("plain", []), ("spec", SPEC + ["--speculative-num-draft-tokens", n_draft])):
        with Server(ls_bin, d, "--device", "cuda", *FAST, *flags, env=NO_ADAPT, timeout=240) as srv:
            alone = srv.generate_greedy(ref["input_ids"], 12)[0]
            with cf.ThreadPoolExecutor(8) as ex:
                batch = list(ex.map(lambda p: srv.generate_greedy(p, 12)[0], prompts))
            loop = srv.generate_greedy(ref["input_ids"] * 3, 60)[0]
            got[label] = (alone, batch, loop, srv.metrics())
    plain, spec = got["plain"], got["spec"]
    assert same(spec[0], ref["greedy"]) >= min(10, same(plain[0], ref["greedy"])), (spec[0], plain[0], ref["greedy"])
    assert same(spec[1][0], ref["greedy"]) >= min(10, same(plain[1][0], ref["greedy"]))
    for a, b in zip(plain[1], spec[1]):
        assert same(a, b) >= 10, (a, b)
    assert spec[3]["spec_verify_rows_total"] > 0, spec[3]
    print(f"{name}: drafts {spec[3]['spec_draft_tokens_total']:.0f}, accepted {spec[3]['spec_accepted_tokens_total']:.0f}; "
          f"60-token loop run equal for {same(plain[2], spec[2])} of 60")


def motif(vocab, n, period, seed):
    rnd = random.Random(seed)
    m = [rnd.choice(vocab) for _ in range(period)]
    return [rnd.choice(vocab) if rnd.random() < 0.125 else m[i % period] for i in range(n)]


def run_chat(srv, i, force):
    body = {"model": "m", "messages": [{"role": "user", "content": f"Request {i}: say something"}],
            "max_tokens": 70, "temperature": 0, "logprobs": True, "top_logprobs": 2, "ignore_eos": True,
            "force_ids": force, "chat_template_kwargs": {"enable_thinking": False}}
    st, out = srv.post_json("/v1/chat/completions", body)
    assert st == 200, out
    return [(t["token"], t["logprob"], [x["logprob"] for x in t["top_logprobs"]])
            for t in out["choices"][0]["logprobs"]["content"]]


def assert_drafts_match_plain(plain, spec, n_forced=30, n=70):
    """Per request, [(token, logprob, top logprobs)] with and without drafts: the n_forced forced
    tokens equal with logprobs within LP_TOL, the free ones equal up to the first near tie (2 x LP_TOL)."""
    for i, (a, b) in enumerate(zip(plain, spec)):
        assert len(a) == len(b) == n
        for k in range(n_forced):
            assert a[k][0] == b[k][0]
            assert abs(a[k][1] - b[k][1]) < LP_TOL, (i, k, a[k], b[k])
        for k in range(n_forced, n):
            if a[k][0] != b[k][0]:
                gap = a[k][2][0] - a[k][2][1] if len(a[k][2]) > 1 else 1.0
                assert gap < 2 * LP_TOL, f"request {i}: free token {k} differs ({a[k][0]!r} vs {b[k][0]!r}) at a margin of {gap}"
                break


def test_demo_forced_prefix_then_free_tokens(ls_bin, demo_model):
    env = {"LASTSTAND_TEST_FORCE_IDS": "1", **NO_ADAPT}
    res = {}
    for label, flags in (("plain", []), ("spec", SPEC + ["--speculative-num-draft-tokens", "5"])):
        with Server(ls_bin, demo_model, "--device", "cuda", "--served-model-name", "m", *FAST, *flags, env=env,
                    timeout=240) as srv:
            vocab = srv.tokenize("the quick brown fox jumps over the lazy dog while seven wise owls watch")
            forces = [motif(vocab, 30, 3 + i % 4, i) for i in range(6)]
            with cf.ThreadPoolExecutor(6) as ex:
                res[label] = list(ex.map(lambda i: run_chat(srv, i, forces[i]), range(6)))
            res[label + "_m"] = srv.metrics()
    m = res["spec_m"]
    assert m["spec_verify_rows_total"] > 10 and 0 < m["spec_accepted_tokens_total"] < m["spec_draft_tokens_total"], m
    assert_drafts_match_plain(res["plain"], res["spec"])
    print(f"demo: {m['spec_verify_rows_total']:.0f} rows verified {m['spec_draft_tokens_total']:.0f} drafts, "
          f"{m['spec_accepted_tokens_total']:.0f} accepted")
