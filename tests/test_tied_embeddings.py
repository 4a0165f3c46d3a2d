"""Tied embeddings (`tie_word_embeddings: true`, as Qwen3-0.6B / 1.7B / 4B ship: no
lm_head.weight on disk, the lm_head is the embedding table) against transformers, the oracle
that wrote tests/fixtures/tied/*/ (bench/tied/gen_tied.py, run on the GPU machine by
bench/device/tied.sh: tiny random dense Qwen3 and Qwen3-MoE, saved by save_pretrained).

Pins, on the CPU:
- the fixtures exercise the tie: their config says so and their safetensors hold no
  lm_head.weight (transformers decided what is on disk);
- `laststand logits` matches every row to max|a-b|/max|b| <= 1e-4 with the same argmax, and
  `--tp 2` (ranks sharing the tied table) as well;
- `laststand generate` reproduces the 12-token greedy continuation;
- nothing is reported as an unused tensor, and a config that says the embeddings are not tied
  while the checkpoint has no lm_head.weight is refused (exit 2) naming the missing tensor.
"""
import json
import os
import shutil
import struct

import numpy as np
import pytest

from conftest import ROOT, run_ls

# LS_TIED_FIXTURES: another folder holding qwen3-tied/ and qwen3_moe-tied/ (bench/device/cleanup.sh
# before the fixtures were in the tree)
TIED = os.environ.get("LS_TIED_FIXTURES") or os.path.join(ROOT, "tests", "fixtures", "tied")
NAMES = ["qwen3-tied", "qwen3_moe-tied"]


def fixture(name):
    if not os.path.isdir(TIED):
        pytest.skip(f"{TIED} absent (bench/device/tied.sh writes the fixtures)")
    d = os.path.join(TIED, name)
    assert os.path.exists(os.path.join(d, "ref.json")), f"{d}: fixture missing (bench/device/tied.sh writes it)"
    return d


def ref_of(d):
    with open(os.path.join(d, "ref.json")) as f:
        return json.load(f)


def st_names(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return set(json.loads(f.read(n))) - {"__metadata__"}


def logits(d, ids, *flags):
    p = run_ls("logits", "--model-path", d, "--ids", ",".join(map(str, ids)), *flags)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    a = np.array(out["logits"], dtype=np.float64)
    assert list(a.shape) == out["shape"]
    return a, p.stderr


def rel_err_rows(a, b):
    return np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_ties_the_lm_head_to_the_embedding(name):
    d = fixture(name)
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["tie_word_embeddings"] is True
    names = st_names(os.path.join(d, "model.safetensors"))
    assert "model.embed_tokens.weight" in names
    assert "lm_head.weight" not in names


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", NAMES)
def test_tied_logits_match_transformers(ls_bin, name, tp):
    d = fixture(name)
    ref = ref_of(d)
    b = np.array(ref["logits"], dtype=np.float64)
    a, err_text = logits(d, ref["input_ids"], "--device", "cpu", "--tp", str(tp))
    assert a.shape == b.shape
    err = rel_err_rows(a, b)
    assert err.max() <= 1e-4, f"{name} tp={tp}: worst row error {err.max():.3g} at position {err.argmax()}"
    assert (a.argmax(1) == b.argmax(1)).all(), f"{name}: argmax differs at {np.nonzero(a.argmax(1) != b.argmax(1))}"
    assert "not used" not in err_text, err_text[-2000:]


@pytest.mark.parametrize("name", NAMES)
def test_tied_generate_reproduces_greedy(ls_bin, name):
    d = fixture(name)
    ref = ref_of(d)
    p = run_ls("generate", "--model-path", d, "--device", "cpu", "--ids", ",".join(map(str, ref["input_ids"])),
               "--max-new-tokens", len(ref["greedy"]))
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["ids"] == ref["greedy"]


def test_untied_config_without_lm_head_names_the_tensor(ls_bin, tmp_path):
    d = tmp_path / "untied"
    shutil.copytree(fixture("qwen3-tied"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (d / "config.json").write_text(json.dumps(cfg))
    p = run_ls("logits", "--model-path", str(d), "--ids", "1,2")
    assert p.returncode == 2, p.stderr[-2000:]
    assert "missing tensor 'lm_head.weight'" in p.stderr, p.stderr[-2000:]
