"""The multi-token-prediction (MTP) head of Qwen3.5 / Qwen3-Next (`laststand logits --mtp`) on the
CPU, against an oracle independent of the C code.

The head is added to the shared fixtures by tests/mtp_fixture.py (numpy: layer 3 scaled and
perturbed as the head's decoder layer, random fc and norms, BF16, an index beside
model.safetensors). Its reference logits, tests/fixtures/mtp_ref.json, are transformers' own
modules on the same bytes in fp32 (tests/tools/gen_mtp_ref.py, run on a machine with torch):
row i = lm_head(mtp.norm(layer(fc(cat(pre_e(embed(ids[i+1])), pre_h(last_hidden_state[i]))))))
at positions 0 .. T-2. `logits --mtp` must match every row to max|a-b|/max|b| <= 2e-3 with the
same argmax wherever the reference's top-2 margin exceeds 1e-2, with --tp 1 and --tp 2 (LS_MTP_REF:
a reference elsewhere).
Until mtp_ref.json exists those two tests skip; the rest need no reference:
  - a config without the MTP key: exit 2 naming the key (mtp_num_hidden_layers /
    num_nextn_predict_layers); a head missing a tensor: exit 2 naming it; one id: refused;
  - the head's tensors change nothing in the model's own logits;
  - --tp 2 equals --tp 1; the rows are causal (a prefix of the ids gives the same first rows);
  - Qwen3.5's release layout (model.language_model.*, fused experts, in the head too) gives the
    same logits as the plain layout of the same weights."""
import json
import os

import numpy as np
import pytest

from conftest import ROOT, SHARED, run_ls
from mtp_fixture import make_mtp_checkpoint, mtp_tensors, read_st_f32, write_mtp
from test_model_fixtures import logits as model_logits, rel_err_rows as rel_rows

MODELS = os.path.join(SHARED, "fixtures", "models")
# LS_MTP_REF: another copy of the reference (e.g. one just written on the GPU machine)
REF = os.environ.get("LS_MTP_REF") or os.path.join(ROOT, "tests", "fixtures", "mtp_ref.json")
CASES = {"qwen3_5_moe_text": "mtp_num_hidden_layers", "qwen3_next": "num_nextn_predict_layers"}
IDS = [5, 77, 301, 12, 999, 64, 512, 8, 3, 700, 41, 250]  # as tests/tools/gen_mtp_ref.py


def fixture(name):
    d = os.path.join(MODELS, name)
    if not os.path.isdir(d):
        pytest.skip(f"{d} missing (../shared is not beside the checkout)")
    return d


def logits(path, ids, *flags):
    """laststand logits on the CPU, as a [rows, vocab] float64 array."""
    return model_logits(path, ids, "--device", "cpu", *flags)


@pytest.fixture
def mtp_dir(tmp_path):
    """make(name) -> a folder holding fixture name with the MTP head (seed 1234)."""
    def make(name):
        d = str(tmp_path / name)
        make_mtp_checkpoint(fixture(name), d, seed=1234)
        return d
    return make


# ---- against transformers (tests/fixtures/mtp_ref.json) ----------------------

def load_ref():
    if not os.path.exists(REF):
        pytest.skip(f"{REF} not generated yet: run tests/tools/gen_mtp_ref.py "
                    "on a machine with torch + transformers (it needs ../shared or LS_SHARED)")
    with open(REF) as f:
        return json.load(f)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_mtp_logits_match_transformers(ls_bin, mtp_dir, name, tp):
    """Every MTP row equals transformers' to 2e-3 of the row's largest logit, and its argmax where the
    reference is not a near tie. Fails if the head is wired differently from vLLM's / SGLang's
    (fc halves swapped, the hidden state taken before the final norm or from the wrong position,
    plain instead of zero-centred norms, the wrong rope positions, a non-causal mask) or if --tp 2
    splits it wrongly."""
    ref = load_ref()
    assert ref["seed"] == 1234
    case = ref["cases"][name]
    b = np.array(case["logits"], dtype=np.float64)
    a = logits(mtp_dir(name), case["ids"], "--mtp", "--tp", tp)
    assert a.shape == b.shape == (len(case["ids"]) - 1, b.shape[1])
    err = rel_rows(a, b)
    assert err.max() <= 2e-3, f"{name} tp {tp}: worst row error {err.max():.3g} at row {err.argmax()} ({err.round(5)})"
    srt = np.sort(b, axis=1)
    clear = srt[:, -1] - srt[:, -2] > 1e-2
    bad = np.nonzero(clear & (a.argmax(1) != b.argmax(1)))[0]
    assert not len(bad), f"{name} tp {tp}: argmax differs at rows {bad.tolist()}"


# ---- needing no reference ----------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_mtp_without_head_names_config_key(ls_bin, name):
    """--mtp on a checkpoint whose config has no MTP layers is a user error (exit 2) that names the
    key to set for this model type. Fails if the head is silently skipped or the wrong key is named."""
    p = run_ls("logits", "--model-path", fixture(name), "--ids", "1,2,3", "--mtp", "--device", "cpu")
    assert p.returncode == 2, p.stderr[-2000:]
    assert CASES[name] in p.stderr, p.stderr[-2000:]
    assert not p.stdout.strip()


@pytest.mark.parametrize("name", sorted(CASES))
def test_mtp_tensors_leave_model_logits_unchanged(ls_bin, mtp_dir, name):
    """Without --mtp the checkpoint with a head (and its index) gives the fixture's logits exactly:
    the extra file and config key change nothing in the model. Fails if the head's layer leaks
    into the model (an extra layer run, its norm taken for the final norm, a shifted KV layer)."""
    a = logits(fixture(name), IDS)
    b = logits(mtp_dir(name), IDS)
    assert np.array_equal(a, b), f"{name}: max diff {np.abs(a - b).max():.3g}"


@pytest.mark.parametrize("name,drop", [("qwen3_5_moe_text", "mtp.fc.weight"), ("qwen3_next", "mtp.fc.weight"),
                                       ("qwen3_next", "mtp.pre_fc_norm_hidden.weight"),
                                       ("qwen3_next", "mtp.layers.0.mlp.shared_expert_gate.weight")])
def test_mtp_missing_tensor_is_named(ls_bin, mtp_dir, name, drop):
    """A head lacking one of its tensors (mtp.safetensors and its index rewritten without it) is
    refused with exit 2 and the tensor's name. Fails if a missing tensor loads as zeros or the
    message names something else."""
    d = mtp_dir(name)
    t = read_st_f32(os.path.join(d, "mtp.safetensors"))
    del t[drop]
    write_mtp(d, t)
    p = run_ls("logits", "--model-path", d, "--ids", "1,2,3", "--mtp", "--device", "cpu")
    assert p.returncode == 2, p.stderr[-2000:]
    assert drop in p.stderr, p.stderr[-2000:]


def test_mtp_fc_wrong_shape_is_named(ls_bin, mtp_dir):
    """mtp.fc.weight must be [H, 2H]: a [H, H] one is refused with exit 2, its name and both shapes."""
    d = mtp_dir("qwen3_next")
    t = read_st_f32(os.path.join(d, "mtp.safetensors"))
    t["mtp.fc.weight"] = t["mtp.fc.weight"][:, :128]
    write_mtp(d, t)
    p = run_ls("logits", "--model-path", d, "--ids", "1,2,3", "--mtp", "--device", "cpu")
    assert p.returncode == 2, p.stderr[-2000:]
    assert "mtp.fc.weight" in p.stderr and "[128, 256]" in p.stderr and "[128, 128]" in p.stderr, p.stderr


@pytest.mark.parametrize("name", sorted(CASES))
def test_mtp_one_id_is_refused(ls_bin, mtp_dir, name):
    """The head needs a hidden state and the next id: one id gives no row, refused with a message
    (not an empty or garbage result)."""
    p = run_ls("logits", "--model-path", mtp_dir(name), "--ids", "7", "--mtp", "--device", "cpu")
    assert p.returncode != 0
    assert "2 token ids" in p.stderr or "MTP" in p.stderr, p.stderr[-2000:]
    assert not p.stdout.strip()


@pytest.mark.parametrize("name", sorted(CASES))
def test_mtp_tp2_equals_tp1_and_rows_are_causal(ls_bin, mtp_dir, name):
    """--tp 2 (CPU ranks) gives the head's logits of --tp 1 to 1e-5; the rows are causal: the first
    6 rows of 12 ids equal the 6 rows of the first 7 ids; row count T-1, vocabulary wide. Fails on
    a head split wrongly across ranks, attention over later rows, or rows shifted by one."""
    d = mtp_dir(name)
    one = logits(d, IDS, "--mtp")
    assert one.shape == (len(IDS) - 1, 1024)
    two = logits(d, IDS, "--mtp", "--tp", "2")
    assert rel_rows(two, one).max() < 1e-5
    pre = logits(d, IDS[:7], "--mtp")
    assert rel_rows(pre, one[:6]).max() < 1e-5
    # the head is not the model: its rows are not the model's own next-token logits
    assert rel_rows(one, logits(d, IDS)[:-1]).min() > 1e-2


def fused_head(t, n_experts):
    """The head's tensors in Qwen3.5's release layout: the experts of mtp.layers.0 as 3-D
    gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I]."""
    p = "mtp.layers.0.mlp.experts."
    out = {k: v for k, v in t.items() if not k.startswith(p)}
    out[p + "gate_up_proj"] = np.stack([np.concatenate([t[f"{p}{e}.gate_proj.weight"], t[f"{p}{e}.up_proj.weight"]])
                                        for e in range(n_experts)])
    out[p + "down_proj"] = np.stack([t[f"{p}{e}.down_proj.weight"] for e in range(n_experts)])
    return out


def test_mtp_release_layout_equals_plain(ls_bin, mtp_dir, tmp_path):
    """qwen3_5_moe-fused holds qwen3_5_moe_text's weights in the release layout (wrapper config
    with text_config, model.language_model.*, fused experts); with the same head in that layout
    (the MTP key in text_config, fused mtp experts) --mtp gives the same logits bit for bit.
    Fails if the wrapper's key or the head's fused experts are not found or are read differently."""
    fused_src = fixture("qwen3_5_moe-fused")
    plain = mtp_dir("qwen3_5_moe_text")
    d = str(tmp_path / "fused")
    make_mtp_checkpoint(fused_src, d)
    with open(os.path.join(d, "config.json")) as f:
        assert json.load(f)["text_config"]["mtp_num_hidden_layers"] == 1
    write_mtp(d, fused_head(mtp_tensors(fixture("qwen3_5_moe_text"), seed=1234), 8))
    a = logits(d, IDS, "--mtp")
    b = logits(plain, IDS, "--mtp")
    assert np.array_equal(a, b), f"max diff {np.abs(a - b).max():.3g}"


def test_mtp_head_on_a_model_without_attention_layers():
    """synth:demo cut to its first layer (a GDN layer: no full-attention layer of its own) still runs
    the head, whose attention needs the KV pages, buffers and page tables a model without attention
    layers would not allocate (S28: the 35B cut to 1 layer failed on CUDA, crashed on the CPU). The
    chain head's rows depend on the next id alone: rows 0 and 2 (next id 5 both) are equal, and the
    chain lists its f."""
    a = logits("synth:demo,layers=1,mtp=chain", [0, 5, 77, 5], "--mtp")
    assert a.shape == (3, 4096)
    assert np.array_equal(a[0], a[2]) and not np.array_equal(a[0], a[1])
    p = run_ls("logits", "--model-path", "synth:demo,layers=1,mtp=chain", "--ids", "0,5", "--mtp", "--chain", "3",
               "--device", "cpu")
    assert p.returncode == 0, p.stderr[-2000:]
    chain = json.loads(p.stdout)["chain"]
    assert len(chain) == 3 and chain[0] == int(a[0].argmax())  # f(5): row 0's next id is 5


def test_logits_chain_flags_are_checked():
    """--chain needs --mtp and a count; --chain-deviate needs --chain and a period of at least 2."""
    for args, want in ((["--chain", "3"], "--chain"), (["--mtp", "--chain", "x"], "--chain"),
                       (["--mtp", "--chain-deviate", "4"], "--chain-deviate"),
                       (["--mtp", "--chain", "3", "--chain-deviate", "1"], "--chain-deviate")):
        p = run_ls("logits", "--model-path", "synth:demo,mtp=chain", "--ids", "0,5", "--device", "cpu", *args)
        assert p.returncode == 2 and want in p.stderr, (args, p.returncode, p.stderr[-300:])
