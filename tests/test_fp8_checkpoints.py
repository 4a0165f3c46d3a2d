"""FP8 (E4M3) checkpoints: the loader keeps FP8 linear weights as FP8 (W_FP8: 1 byte a weight, fp32
scales; the gemm backends multiply fp8 x scale exactly) and dequantizes to BF16 only what must be
BF16 (routed and shared experts, router, embedding, lm_head).

The oracle is independent of the C code: this file quantizes a BF16 fixture's linear weights to
FP8 itself (numpy), writes the checkpoint in the public layouts, and writes the same bytes'
values into a plain checkpoint: fp8 value x scale in fp32 (exact E4M3 times the fp32 scale,
rounded once to fp32) as F32 tensors where the loader keeps FP8, rounded once more to BF16
(round to nearest even) where it dequantizes. On the CPU `laststand logits` of the FP8 folder must
equal that folder's bit for bit (the same fp32 weight values reach the same kernels), for
  - Hugging Face's fine-grained FP8 (Qwen / DeepSeek FP8 releases): quant_method "fp8",
    weight_block_size, '.weight_scale_inv' per block (blocks that do not divide the matrix);
  - ModelOpt FP8: quant_method "modelopt", quant_algo FP8, '.weight_scale' per tensor (or per row),
    '.input_scale';
  - ModelOpt MIXED_PRECISION: NVFP4 experts (`laststand quantize`) beside FP8 attention (and the
    doctor then tests the experts' shapes on fp4_gemm, the attention's as FP8 gemm);
  - the demo model served with FP8 attention and shared expert: the OpenAI SDK's greedy chat gets
    the plain checkpoint's text.
With LS_TEST_DEVICE=cuda (bench/device/fp8.sh) the forward passes run on the GPU with BF16
activations, where bit equality with a CPU oracle is not the contract: there the dense fixture's
logits must be within the fixtures' 2e-2 of the CPU's fp32 run of the same FP8 checkpoint, and
the GPU kernels themselves are checked against fp64 by tests/unit/test_fp8_gemm_cuda.c and the
doctor.
Malformed FP8 tensors are refused with exit 2 (an FP8 format other than E4M3: exit 1, unsupported)
and a message naming the tensor or key."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import SHARED, run_ls
from st_util import load_tensors, rebuild_st

MODELS = os.path.join(SHARED, "fixtures", "models")

# ---- the formats, in numpy ---------------------------------------------------

def bf16_to_f32(b, shape):
    return (np.frombuffer(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)


def f32_to_bf16(a):
    """Round to nearest even (finite values)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def e4m3_table():
    """The value of every E4M3FN code (bias 7, no infinity, 0x7f / 0xff NaN)."""
    v = np.zeros(256, dtype=np.float32)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            v[c] = np.nan
            continue
        x = m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        v[c] = -x if s else x
    return v


E4M3 = e4m3_table()
POS = E4M3[:127]  # codes 0..126: the finite non-negative values, increasing


def to_e4m3(x):
    """Nearest E4M3 code (ties to the even code), saturating at 448."""
    a = np.minimum(np.abs(x), 448.0).astype(np.float32)
    hi = np.clip(np.searchsorted(POS, a), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dl, dh = a - POS[lo], POS[hi] - a
    code = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi))).astype(np.uint8)
    return code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)


def dequant(codes, scale_full):
    """The weight's values as the loader uses them: fp8 x scale in fp32."""
    return E4M3[codes] * scale_full.astype(np.float32)


def kept_fp8(name):
    """Whether the loader keeps this linear FP8 (else it dequantizes it to BF16): everything but
    the MoE's routed and shared experts (the router and lm_head are never quantized here)."""
    return ".experts." not in name and ".shared_expert." not in name


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_linear(name, shape, only=None):
    if not name.endswith(".weight") or len(shape) != 2:
        return False
    mod = name[:-len(".weight")].rsplit(".", 1)[-1]
    return mod in (only or LINEAR)


def convert(src, fp8_dir, bf16_dir, form, block=(16, 48), only=None):
    """Write src's linears as FP8 (form: 'block', 'tensor', 'row') into fp8_dir and their values
    into bf16_dir (F32 where the loader keeps FP8, BF16 where it dequantizes); everything else
    copied."""
    ts = load_tensors(os.path.join(src, "model.safetensors"))
    fp8, bf = {}, {}
    for name, (dt, shape, b) in ts.items():
        if dt != "BF16" or not is_linear(name, shape, only):
            fp8[name] = bf[name] = (dt, shape, b)
            continue
        w = bf16_to_f32(b, shape)
        N, K = shape
        p = name[:-len(".weight")]
        if form == "block":
            br, bc = block
            nb, kb = -(-N // br), -(-K // bc)
            amax = np.zeros((nb, kb), dtype=np.float32)
            for i in range(nb):
                for j in range(kb):
                    amax[i, j] = np.abs(w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]).max()
            sc = np.where(amax > 0, amax / 448.0, 1.0).astype(np.float32)
            full = np.repeat(np.repeat(sc, br, 0), bc, 1)[:N, :K]
            fp8[p + ".weight_scale_inv"] = ("F32", [nb, kb], sc.tobytes())
        elif form == "tensor":
            sc = np.float32(max(np.abs(w).max(), 1e-12) / 448.0)
            full = np.full((N, K), sc, dtype=np.float32)
            fp8[p + ".weight_scale"] = ("F32", [], np.array(sc, dtype=np.float32).tobytes())
            fp8[p + ".input_scale"] = ("F32", [], np.array(0.02, dtype=np.float32).tobytes())
        else:  # row
            sc = (np.maximum(np.abs(w).max(axis=1), 1e-12) / 448.0).astype(np.float32)
            full = np.repeat(sc[:, None], K, 1)
            fp8[p + ".weight_scale"] = ("F32", [N, 1], sc.tobytes())
        codes = to_e4m3(w / full)
        fp8[name] = ("F8_E4M3", shape, codes.tobytes())
        v = dequant(codes, full)
        bf[name] = ("F32", shape, v.tobytes()) if kept_fp8(name) else ("BF16", shape, f32_to_bf16(v).tobytes())
    for d, t in ((fp8_dir, fp8), (bf16_dir, bf)):
        os.makedirs(d, exist_ok=True)
        rebuild_st(os.path.join(d, "model.safetensors"), t)
    return fp8


def write_config(src, d, quant):
    with open(os.path.join(src, "config.json")) as f:
        c = json.load(f)
    c.pop("quantization_config", None)
    if quant:
        c["quantization_config"] = quant
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)


# LS_TEST_DEVICE=cuda (bench/device/fp8.sh): the FP8 forward passes on that device, not the default
DEV = ["--device", os.environ["LS_TEST_DEVICE"]] if os.environ.get("LS_TEST_DEVICE") else []
GPU = bool(DEV) and DEV[1] != "cpu"


def logits(d, ids, dev=None):
    p = run_ls("logits", "--model-path", d, "--ids", ",".join(map(str, ids)), *(DEV if dev is None else dev))
    assert p.returncode == 0, p.stderr[-2000:]
    return np.array(json.loads(p.stdout)["logits"], dtype=np.float64)


def ref(name):
    with open(os.path.join(MODELS, name, "ref.json")) as f:
        return json.load(f)


FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [16, 48]}
MO_FP8 = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None,
          "ignore": ["lm_head", "model.embed_tokens"]}

# ---- equality with the independent dequantization ---------------------------------------------


@pytest.mark.parametrize("name,form,quant", [
    ("qwen3", "block", FP8_BLOCK),
    ("qwen3_moe", "block", FP8_BLOCK),
    ("qwen3_moe", "tensor", MO_FP8),
    ("qwen3_5_moe_text", "row", dict(MO_FP8, quant_algo="FP8_PER_CHANNEL_PER_TOKEN")),
])
def test_fp8_logits_equal_the_dequantized_model(ls_bin, shared_dir, tmp_path, name, form, quant):
    src = os.path.join(MODELS, name)
    fd, bd = str(tmp_path / "fp8"), str(tmp_path / "plain")
    conv = convert(src, fd, bd, form)
    assert any(v[0] == "F8_E4M3" for v in conv.values())
    write_config(src, fd, quant)
    write_config(src, bd, None)
    r = ref(name)
    if GPU:
        if name != "qwen3":
            pytest.skip("on the GPU the dense fixture carries the check (BF16 activations; see the module doc)")
        a, b = logits(fd, r["input_ids"]), logits(fd, r["input_ids"], dev=["--device", "cpu"])
        err = (np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max()
        assert err <= 2e-2, f"worst row max |gpu - cpu| / max |cpu| = {err:.3g}"
        return
    a, b = logits(fd, r["input_ids"]), logits(bd, r["input_ids"])
    assert a.shape == b.shape
    assert np.array_equal(a, b), f"max |fp8 - plain| = {np.abs(a - b).max():.3g}"


def test_mixed_precision_nvfp4_experts_fp8_attention(ls_bin, shared_dir, tmp_path):
    """ModelOpt MIXED_PRECISION: the experts NVFP4 (laststand quantize), attention FP8."""
    src = os.path.join(MODELS, "qwen3_moe")
    nv = str(tmp_path / "nvfp4")
    p = run_ls("quantize", "--in", src, "--out", nv, "--exclude", "*self_attn*")
    assert p.returncode == 0, p.stderr[-2000:]
    fd, bd = str(tmp_path / "fp8"), str(tmp_path / "bf16")
    conv = convert(nv, fd, bd, "tensor", only=("q_proj", "k_proj", "v_proj", "o_proj"))
    kinds = {v[0] for k, v in conv.items() if k.endswith(".weight")}
    assert {"F8_E4M3", "U8"} <= kinds, kinds  # both formats in one checkpoint
    with open(os.path.join(nv, "config.json")) as f:
        q = json.load(f)["quantization_config"]
    # no exclude for the attention: in a mixed checkpoint its FP8 tensors say what it is
    mixed = {k: ([x for x in v if "self_attn" not in x] if k in ("ignore", "exclude_modules") else v)
             for k, v in q.items()}
    write_config(nv, fd, dict(mixed, quant_algo="MIXED_PRECISION"))
    write_config(nv, bd, q)
    ids = ref("qwen3_moe")["input_ids"]
    if not GPU:
        a, b = logits(fd, ids), logits(bd, ids)
        assert np.array_equal(a, b), f"max |mixed - nvfp4 + f32| = {np.abs(a - b).max():.3g}"
    # the doctor tests the shapes the model runs: experts on fp4_gemm, the attention as FP8 gemm
    js = tmp_path / "rep.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("LASTSTAND_TEST_BROKEN_BACKENDS", None)
    p = subprocess.run([ls_bin, "doctor", "--device", "cpu", "--model-path", fd, "--families", "fp4_gemm,gemm",
                        "--m", "1", "--json", str(js)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rep = json.loads(js.read_text())
    titles = {t["family"]: " ".join(x["title"] for x in rep["tables"] if x["family"] == t["family"])
              for t in rep["tables"]}
    assert "experts" in titles.get("fp4_gemm", "") and "attn" not in titles.get("fp4_gemm", ""), titles
    assert "attn" in titles.get("gemm", ""), titles
    fp8_tabs = [t for t in rep["tables"] if t["family"] == "gemm" and "FP8 weight" in t["title"]]
    assert fp8_tabs and all("attn" in t["title"] for t in fp8_tabs), titles


@pytest.mark.parametrize("name,form,quant,upload", [
    ("qwen3", "block", FP8_BLOCK, "0"),       # (16, 48) blocks: rank 1's columns start inside a block
    ("qwen3_5_moe_text", "row", dict(MO_FP8, quant_algo="FP8_PER_CHANNEL_PER_TOKEN"), "0"),
    ("qwen3", "row", dict(MO_FP8, quant_algo="FP8_PER_CHANNEL_PER_TOKEN"), "1"),  # the GPU's load path:
    # row slices as views into the whole tensor's per-row scales (fs_r0)
])
def test_fp8_tensor_parallel_equals_one_rank(ls_bin, shared_dir, tmp_path, monkeypatch, name, form, quant, upload):
    """--tp 2 on CPU ranks slices the FP8 weights (row slices: the scales found through fs_r0;
    column slices: fs_c0) and gives the one-rank logits up to the all-reduce's summation order."""
    if GPU:
        pytest.skip("CPU ranks")
    src = os.path.join(MODELS, name)
    fd = str(tmp_path / "fp8")
    convert(src, fd, str(tmp_path / "plain"), form)
    write_config(src, fd, quant)
    monkeypatch.setenv("LASTSTAND_TEST_CPU_UPLOAD", upload)
    ids = ref(name)["input_ids"]
    one = logits(fd, ids, dev=["--device", "cpu"])
    two = logits(fd, ids, dev=["--device", "cpu", "--tp", "2"])
    err = (np.abs(two - one).max(axis=1) / np.abs(one).max(axis=1)).max()
    assert err < 1e-5, f"worst row max |tp2 - tp1| / max |tp1| = {err:.3g}"


def test_generate_from_fp8_checkpoint_equals_the_plain_one(ls_bin, shared_dir, tmp_path):
    if GPU:
        pytest.skip("bit equality with the plain checkpoint is the CPU's contract (see the module doc)")
    src = os.path.join(MODELS, "qwen3_moe")
    fd, bd = str(tmp_path / "fp8"), str(tmp_path / "plain")
    convert(src, fd, bd, "block")
    write_config(src, fd, FP8_BLOCK)
    write_config(src, bd, None)
    ids = ",".join(map(str, ref("qwen3_moe")["input_ids"][:6]))
    outs = []
    for d in (fd, bd):
        p = run_ls("generate", "--model-path", d, "--ids", ids, "--max-new-tokens", "8", *DEV)
        assert p.returncode == 0, p.stderr[-2000:]
        outs.append(p.stdout)
    assert outs[0] == outs[1]


def test_serve_fp8_checkpoint_through_the_openai_sdk(ls_bin, demo_model, tmp_path):
    """The demo model (Qwen3.5-MoE, NVFP4 experts) with its attention and shared expert in FP8
    (MIXED_PRECISION), served on the CPU: the OpenAI SDK's greedy chat gets the text of the plain
    checkpoint that holds the same values."""
    if GPU:
        pytest.skip("a CPU server (bit equality with the plain checkpoint is the CPU's contract)")
    import openai
    from e2e_util import Server
    fd, bd = str(tmp_path / "fp8"), str(tmp_path / "plain")
    conv = convert(demo_model, fd, bd, "tensor")
    assert sum(v[0] == "F8_E4M3" for v in conv.values()) >= 4
    with open(os.path.join(demo_model, "config.json")) as f:
        q = json.load(f)["quantization_config"]
    write_config(demo_model, fd, dict(q, quant_algo="MIXED_PRECISION"))
    write_config(demo_model, bd, q)
    for d in (fd, bd):
        for n in os.listdir(demo_model):
            if n.startswith(("tokenizer", "chat_template", "generation_config")):
                shutil.copy(os.path.join(demo_model, n), d)
    texts = []
    for d in (fd, bd):
        with Server(ls_bin, d, "--device", "cpu") as srv:
            c = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)
            r = c.chat.completions.create(model=c.models.list().data[0].id, temperature=0, max_tokens=16,
                                          messages=[{"role": "user", "content": "Name three colours."}])
            texts.append((r.choices[0].message.content, r.choices[0].message.reasoning_content
                          if hasattr(r.choices[0].message, "reasoning_content") else None, r.usage.completion_tokens))
    assert texts[0] == texts[1], texts
    assert texts[0][2] > 0


# ---- malformed FP8 tensors: exit 2 naming the culprit ------------------------------------------


def fp8_model(tmp_path):
    src = os.path.join(MODELS, "qwen3")
    fd = str(tmp_path / "fp8")
    convert(src, fd, str(tmp_path / "bf16"), "block")
    write_config(src, fd, FP8_BLOCK)
    return fd


def refused(d, *needles, code=2):
    p = run_ls("logits", "--model-path", d, "--ids", "1,2,3")
    assert p.returncode == code, (p.returncode, p.stderr[-2000:])
    for n in needles:
        assert n in p.stderr, f"{n!r} not in: {p.stderr[-1500:]}"


def edit(d, fn):
    path = os.path.join(d, "model.safetensors")
    ts = load_tensors(path)
    fn(ts)
    rebuild_st(path, ts)


def test_missing_scale_names_the_weight(ls_bin, shared_dir, tmp_path):
    d = fp8_model(tmp_path)
    edit(d, lambda ts: ts.pop("model.layers.0.self_attn.q_proj.weight_scale_inv"))
    refused(d, "model.layers.0.self_attn.q_proj.weight", "FP8", "weight_scale_inv")


def test_block_scales_of_the_wrong_shape_are_named(ls_bin, shared_dir, tmp_path):
    d = fp8_model(tmp_path)
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"]["weight_block_size"] = [32, 48]  # the scales were made for [16, 48]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    refused(d, "weight_scale_inv", "weight_block_size [32, 48]", "expected")


def test_nan_code_is_named(ls_bin, shared_dir, tmp_path):
    d = fp8_model(tmp_path)
    name = "model.layers.1.mlp.down_proj.weight"

    def poison(ts):
        dt, shape, b = ts[name]
        b = bytearray(b)
        b[5] = 0x7F
        ts[name] = (dt, shape, bytes(b))
    edit(d, poison)
    refused(d, name, "NaN")


def test_nonfinite_scale_is_named(ls_bin, shared_dir, tmp_path):
    d = fp8_model(tmp_path)
    name = "model.layers.0.mlp.up_proj.weight_scale_inv"

    def poison(ts):
        dt, shape, b = ts[name]
        a = np.frombuffer(b, dtype=np.float32).copy()
        a[0] = np.inf
        ts[name] = (dt, shape, a.tobytes())
    edit(d, poison)
    refused(d, name, "finite")


def test_unsupported_fp8_format_names_the_key(ls_bin, shared_dir, tmp_path):
    d = fp8_model(tmp_path)
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"]["fmt"] = "e5m2"
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    refused(d, "quantization_config.fmt", "e4m3", code=1)  # valid, but not a format laststand runs
