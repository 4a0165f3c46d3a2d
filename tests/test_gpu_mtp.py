"""MTP drafts on a GPU (skipped without one): the checkpoint's multi-token-prediction head on CUDA
(BF16), as a forward pass (`laststand logits --mtp`) and drafting for `serve --speculative-algorithm
mtp`. tests/test_mtp_head.py pins the head's math on the CPU against transformers; here the CUDA path
is pinned against that CPU path.

Pins:
- synth:demo,mtp=chain (a head that depends on the next token alone: embedding, the norms, mtp.fc,
  the layer's residual path, mtp.norm, lm_head): CUDA logits within 2e-2 of the CPU's per row, the
  same argmax, and the same 24-step chain f(t);
- the fixtures with a random head (tests/mtp_fixture.py; every part of the head's layer runs):
  CUDA vs CPU per-row error and argmax agreement, bounded by the main model's own CUDA-vs-CPU error
  on the same ids (the head reads the model's BF16 hidden state);
- serving synth:demo,mtp=chain on CUDA: 6 concurrent completions forced along the chain with a
  deviation every 5th .. 10th token, then free tokens: ids equal to a server without drafts up to the first near tie
  (see test_gpu_speculative.py for why), forced tokens' logprobs within LP_TOL, and drafts
  accepted in full, in part and not at all (/metrics).
"""
import concurrent.futures as cf
import json
import os
import random
import subprocess

import numpy as np
import pytest

from conftest import SHARED, requires_gpu
from e2e_util import Server
from mtp_fixture import make_mtp_checkpoint
from test_gpu_speculative import assert_drafts_match_plain
from test_model_fixtures import rel_err_rows as rel_rows

pytestmark = requires_gpu

MODELS = os.path.join(SHARED, "fixtures", "models")
CHAIN = "synth:demo,mtp=chain"
FAST = ["--doctor-buckets", "1,64", "--max-running-requests", "8", "--cuda-graph-max-bs", "8"]
ENV = {"LASTSTAND_TEST_FORCE_IDS": "1", "LASTSTAND_SPEC_ADAPT": "0"}


def logits(ls_bin, path, ids, *flags):
    out = subprocess.run([ls_bin, "logits", "--model-path", path, "--ids", ",".join(map(str, ids)), *flags],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_chain_head_cuda_equals_cpu(ls_bin):
    ids = [0, 5, 77, 301, 12, 999, 64, 512, 8, 3, 700]
    a = np.array(logits(ls_bin, CHAIN, ids, "--mtp", "--device", "cuda")["logits"])
    b = np.array(logits(ls_bin, CHAIN, ids, "--mtp", "--device", "cpu")["logits"])
    err = rel_rows(a, b)
    assert err.max() <= 2e-2, err
    assert (a.argmax(1) == b.argmax(1)).all()
    # CUDA's chain, each step checked against the CPU's row for its input: the CPU's argmax, or
    # within 2e-2 of the row's largest logit (a BF16 near tie; the chains then part)
    ca = logits(ls_bin, CHAIN, [0, 2], "--mtp", "--chain", "24", "--device", "cuda")["chain"]
    rows = np.array(logits(ls_bin, CHAIN, [0, 2] + ca[:-1], "--mtp", "--device", "cpu")["logits"])
    ties = 0
    for k, t in enumerate(ca):
        r = rows[k]
        if t != r.argmax():
            assert r.max() - r[t] <= 2e-2 * np.abs(r).max(), (k, t, int(r.argmax()), r.max() - r[t])
            ties += 1
    print(f"chain head: CUDA vs CPU worst row {err.max():.3g}; CUDA's 24-step chain {ca[:8]}... "
          f"({ties} steps at a near tie)")


@pytest.mark.parametrize("name", ["qwen3_5_moe_text", "qwen3_next"])
def test_fixture_head_cuda_vs_cpu(ls_bin, tmp_path, name):
    src = os.path.join(MODELS, name)
    if not os.path.exists(os.path.join(src, "config.json")):
        pytest.skip(f"{src} missing")
    d = str(tmp_path / name)
    make_mtp_checkpoint(src, d, seed=1234)
    ids = [5, 77, 301, 12, 999, 64, 512, 8, 3, 700, 41, 250]
    main = {dev: np.array(logits(ls_bin, d, ids, "--device", dev)["logits"]) for dev in ("cuda", "cpu")}
    head = {dev: np.array(logits(ls_bin, d, ids, "--mtp", "--device", dev)["logits"]) for dev in ("cuda", "cpu")}
    e_main, e_head = rel_rows(main["cuda"], main["cpu"]), rel_rows(head["cuda"], head["cpu"])
    srt = np.sort(head["cpu"], axis=1)
    clear = srt[:, -1] - srt[:, -2] > 0.5
    agree = head["cuda"].argmax(1) == head["cpu"].argmax(1)
    print(f"{name}: CUDA vs CPU worst row: model {e_main.max():.3g}, MTP head {e_head.max():.3g}; "
          f"head argmax equal on {agree.sum()} of {len(agree)} rows ({clear.sum()} with a margin > 0.5)")
    assert agree[clear].all(), (np.nonzero(clear & ~agree)[0], e_head)
    assert e_head.max() <= 2 * e_main.max() + 0.1, (e_head, e_main)


def chain_force(ls_bin, start, n, every):
    """n ids along the chain head's f from start, every `every`-th one a pseudo-random id (the chain
    goes on from it); f from the CPU, which test_chain_head_cuda_equals_cpu pins equal to CUDA's."""
    return logits(ls_bin, CHAIN, [0, start], "--mtp", "--chain", str(n), "--chain-deviate", str(every),
                  "--device", "cpu")["chain"]


def run_completion(srv, prompt, force):
    body = {"model": "m", "prompt": prompt, "max_tokens": 70, "temperature": 0, "logprobs": 2, "ignore_eos": True,
            "force_ids": force}
    st, out = srv.post_json("/v1/completions", body)
    assert st == 200, out
    lp = out["choices"][0]["logprobs"]
    return list(zip(lp["tokens"], lp["token_logprobs"], [sorted(x.values(), reverse=True) for x in lp["top_logprobs"]]))


def test_serve_mtp_drafts_match_plain(ls_bin):
    rnd = random.Random(3)
    prompts = [[rnd.randrange(1000, 4000) for _ in range(20 + 7 * i)] for i in range(6)]
    forces = [chain_force(ls_bin, prompts[i][-1], 30, 5 + i) for i in range(6)]
    res = {}
    for label, flags in (("plain", []), ("mtp", ["--speculative-algorithm", "mtp",
                                                 "--speculative-num-draft-tokens", "4"])):
        with Server(ls_bin, CHAIN, "--device", "cuda", "--served-model-name", "m", *FAST, *flags, env=ENV,
                    timeout=240) as srv:
            with cf.ThreadPoolExecutor(6) as ex:
                res[label] = list(ex.map(lambda i: run_completion(srv, prompts[i], forces[i]), range(6)))
            res[label + "_m"] = srv.metrics()
    m = res["mtp_m"]
    assert m["spec_verify_rows_total"] > 10 and 0 < m["spec_accepted_tokens_total"] < m["spec_draft_tokens_total"], m
    assert_drafts_match_plain(res["plain"], res["mtp"])
    print(f"demo chain head: {m['spec_verify_rows_total']:.0f} rows verified {m['spec_draft_tokens_total']:.0f} drafts, "
          f"{m['spec_accepted_tokens_total']:.0f} accepted")
