"""Tied embeddings on a GPU (skipped without one): `laststand logits --device cuda` on the
tied fixtures (tests/fixtures/tied, written by transformers: see test_tied_embeddings.py)
against transformers' fp32 logits, at the CUDA bar (BF16 activations): max|a-b|/max|b| <= 2e-2
on every row, the same argmax wherever the reference's top-2 margin exceeds 0.05, and
`generate --device cuda` reproducing at least 10 of the 12 greedy tokens. With every lm_head
backend or plan the doctor may pick for the vocab projection (the gemm family's CUDA
backends, alone and as a small-M / large-M plan) and auto: the tied table is the embedding's
device copy (model.c visit_all), read by each of them as the lm_head.
"""
import json
import os

import numpy as np
import pytest

from conftest import ROOT, requires_gpu, run_ls

pytestmark = requires_gpu

# LS_TIED_FIXTURES: another folder holding qwen3-tied/ and qwen3_moe-tied/ (bench/device/cleanup.sh
# before the fixtures were in the tree)
TIED = os.environ.get("LS_TIED_FIXTURES") or os.path.join(ROOT, "tests", "fixtures", "tied")
NAMES = ["qwen3-tied", "qwen3_moe-tied"]
# what the doctor may pick for the lm_head: a gemm backend that takes every M, or cuda_gemv up to
# its bound (16) then one that does
LM_HEAD = ["auto", "cuda_cublaslt", "cuda_ref", "cuda_gemv:8,cuda_cublaslt", "cuda_gemv:16,cuda_cublaslt"]


def ref_of(name):
    if not os.path.isdir(TIED):
        pytest.skip(f"{TIED} absent (bench/device/tied.sh writes the fixtures)")
    d = os.path.join(TIED, name)
    assert os.path.exists(os.path.join(d, "ref.json")), f"{d}: fixture missing"
    with open(os.path.join(d, "ref.json")) as f:
        return d, json.load(f)


@pytest.mark.parametrize("lm", LM_HEAD)
@pytest.mark.parametrize("name", NAMES)
def test_tied_cuda_logits_match_transformers(ls_bin, name, lm):
    d, ref = ref_of(name)
    p = run_ls("logits", "--model-path", d, "--ids", ",".join(map(str, ref["input_ids"])), "--device", "cuda",
               "--lm-head-backend", lm, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    a = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    b = np.array(ref["logits"], dtype=np.float64)
    assert a.shape == b.shape and np.isfinite(a).all()
    rel = np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)
    assert rel.max() <= 2e-2, f"{name} {lm}: worst row {rel.argmax()}: {rel.max():.3e}"
    top2 = np.sort(b, axis=1)[:, -2:]
    sure = (top2[:, 1] - top2[:, 0]) > 0.05
    bad = np.nonzero((a.argmax(1) != b.argmax(1)) & sure)[0]
    assert not len(bad), f"{name} {lm}: argmax differs at rows {bad.tolist()}"


@pytest.mark.parametrize("lm", ["auto", "cuda_gemv:16,cuda_cublaslt"])
@pytest.mark.parametrize("name", NAMES)
def test_tied_cuda_generate_follows_greedy(ls_bin, name, lm):
    d, ref = ref_of(name)
    p = run_ls("generate", "--model-path", d, "--ids", ",".join(map(str, ref["input_ids"])), "--device", "cuda",
               "--lm-head-backend", lm, "--max-new-tokens", len(ref["greedy"]), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout)["ids"]
    same = sum(x == y for x, y in zip(got, ref["greedy"]))
    assert same >= 10, f"{name} {lm}: {same}/12 greedy tokens: {got} vs {ref['greedy']}"


def test_small_m_backend_alone_is_refused_naming_the_tied_table(ls_bin):
    """cuda_gemv takes M <= 16: named alone for the lm_head it is refused at open (exit 2), and
    the tensor named is the embedding table the tied lm_head reads."""
    d, ref = ref_of("qwen3-tied")
    p = run_ls("logits", "--model-path", d, "--ids", "1,2", "--device", "cuda", "--lm-head-backend", "cuda_gemv",
               timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "--lm-head-backend cuda_gemv" in p.stderr and "'model.embed_tokens.weight' [1024 x 128]" in p.stderr, \
        p.stderr[-2000:]
    assert not p.stdout.strip()
