"""Tensor parallelism on the CPU device (ranks are threads with a shared-memory
all-reduce): `logits --tp N` equals `--tp 1` to 1e-5 and still matches
transformers (../shared/fixtures/models/*/ref.json) to 1e-4, KV heads
replicated when the ranks outnumber them, `generate --tp 2` (engine, paged KV
and GDN slots per rank) reproduces the greedy continuation, and a --tp that
does not split the model is refused with exit 2 naming what does not split."""
import json
import os

import numpy as np
import pytest

from conftest import SHARED, run_ls

MODELS = os.path.join(SHARED, "fixtures", "models")


def logits(model, ids, *flags):
    p = run_ls("logits", "--model-path", os.path.join(MODELS, model), "--ids", ",".join(map(str, ids)), *flags)
    assert p.returncode == 0, p.stderr[-2000:]
    return np.array(json.loads(p.stdout)["logits"], dtype=np.float64)


def rel(a, b):
    return (np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max()


def ref(model):
    with open(os.path.join(MODELS, model, "ref.json")) as f:
        return json.load(f)


# BF16 fixtures whose heads and intermediate sizes split in two; qwen3 and
# qwen3_moe (2 KV heads) also in four, with each KV head replicated on two ranks.
@pytest.mark.parametrize("model,tp", [("qwen3", 2), ("qwen3", 4), ("qwen3_moe", 2), ("qwen3_moe", 4),
                                      ("qwen3_next", 2), ("qwen3_5_moe_text", 2), ("qwen3_5_moe_vl", 2)])
def test_tp_logits_equal_tp1_and_transformers(ls_bin, shared_dir, model, tp):
    r = ref(model)
    one = logits(model, r["input_ids"])
    many = logits(model, r["input_ids"], "--tp", str(tp))
    hf = np.array(r["logits"], dtype=np.float64)
    assert rel(many, one) < 1e-5
    assert rel(many, hf) < 1e-4
    assert (many.argmax(1) == hf.argmax(1)).all()


@pytest.mark.parametrize("model", ["qwen3_moe", "qwen3_next"])
def test_tp_generate_reproduces_greedy(ls_bin, shared_dir, model):
    r = ref(model)
    p = run_ls("generate", "--model-path", os.path.join(MODELS, model), "--ids", ",".join(map(str, r["input_ids"])),
               "--max-new-tokens", len(r["greedy"]), "--tp", "2")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["ids"] == r["greedy"]


@pytest.mark.parametrize("model,tp,needle", [
    ("qwen3_next", 4, "linear_num_key_heads = 2"),
    ("qwen3_moe", 3, "does not split"),
    ("qwen3_moe-nvfp4", 2, "16-element blocks"),
])
def test_tp_that_does_not_split_is_refused(ls_bin, shared_dir, model, tp, needle):
    for cmd in ("logits", "generate"):
        p = run_ls(cmd, "--model-path", os.path.join(MODELS, model), "--ids", "1,2", "--tp", str(tp))
        assert p.returncode == 2, (cmd, p.returncode, p.stderr)
        assert needle in p.stderr and "--tp" in p.stderr, (cmd, p.stderr)


def test_tp_flag_values(ls_bin, shared_dir):
    for v in ("0", "x", "17"):
        p = run_ls("logits", "--model-path", os.path.join(MODELS, "qwen3"), "--ids", "1", "--tp", v)
        assert p.returncode == 2 and "--tp" in p.stderr
