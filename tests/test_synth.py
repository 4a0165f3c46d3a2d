"""`laststand synth` and `laststand quantize`.

Oracles: the shape table of reference/qwen35-and-nvfp4.md (sections 1.2, 1.3,
4.3) and the public Qwen3-30B-A3B / Qwen3-Next configs, typed in here by hand;
the tensor naming of the transformers-written fixtures in ../shared; HF
`safetensors` and `tokenizers` for reading what synth writes; a numpy
re-implementation of ModelOpt NVFP4 quantization (reference section 4.6)."""
import json
import os
import re
import resource
import shutil
import struct
import time

import numpy as np
import pytest

from conftest import BIN, SHARED, run_ls
from st_util import load_tensors

# ---- the reference table (hand-copied, not computed by laststand) -------------

REF = {
    "qwen3.5-397b-a17b": dict(H=4096, L=60, nh=32, nkv=2, hd=256, nk=16, nv=64, dk=128, dv=128, E=512, k=10, I=1024,
                              Is=1024, V=248320, theta=1e7),
    "qwen3.5-122b-a10b": dict(H=3072, L=48, nh=32, nkv=2, hd=256, nk=16, nv=64, dk=128, dv=128, E=256, k=8, I=1024,
                              Is=1024, V=248320, theta=1e7),
    "qwen3.5-35b-a3b": dict(H=2048, L=40, nh=16, nkv=2, hd=256, nk=16, nv=32, dk=128, dv=128, E=256, k=8, I=512,
                            Is=512, V=248320, theta=1e7),
    "qwen3-next-80b-a3b": dict(H=2048, L=48, nh=16, nkv=2, hd=256, nk=16, nv=32, dk=128, dv=128, E=512, k=10, I=512,
                               Is=512, V=151936, theta=1e7),
    "qwen3-30b-a3b": dict(H=2048, L=48, nh=32, nkv=4, hd=128, E=128, k=8, I=768, V=151936, theta=1e6),
    "qwen3-235b-a22b": dict(H=4096, L=94, nh=64, nkv=4, hd=128, E=128, k=8, I=1536, V=151936, theta=1e6),
    "demo": dict(H=256, L=8, nh=4, nkv=2, hd=64, nk=4, nv=8, dk=32, dv=32, E=16, k=4, I=128, Is=128, V=4096,
                 theta=1e7),
}
# reference section 4.3: per-expert NVFP4 shapes (weight U8, weight_scale F8_E4M3)
EXPERT_NVFP4 = {
    "qwen3.5-397b-a17b": {"gate": ([1024, 2048], [1024, 256]), "down": ([4096, 512], [4096, 64])},
    "qwen3.5-122b-a10b": {"gate": ([1024, 1536], [1024, 192]), "down": ([3072, 512], [3072, 64])},
    "qwen3.5-35b-a3b": {"gate": ([512, 1024], [512, 128]), "down": ([2048, 256], [2048, 32])},
}
# reference section 1.3 (35B): conv_dim, q_proj out, k/v out
DERIVED_35B = dict(conv_dim=8192, q_out=8192, o_in=4096, kv_out=512)


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


def all_headers(d):
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            for k, v in header(os.path.join(d, fn)).items():
                assert k not in out, f"{k} in two shards"
                out[k] = v
    return out


def synth(out, preset, *extra):
    t0 = time.time()
    run_ls("synth", "--preset", preset, "--out", out, *extra, check=True, timeout=600)
    return time.time() - t0


def expected_qwen35(r, layers, nvfp4, prefix="model.language_model."):
    """name -> (dtype, shape) for a Qwen3.5 checkpoint, from the reference's section 3/4 lists, and its
    multi-token-prediction head as the released checkpoints carry it (vLLM's / SGLang's names: mtp.fc
    [H, 2H], the three mtp norms, mtp.layers.0.* a full-attention MoE layer)."""
    H, V = r["H"], r["V"]
    e = {"lm_head.weight": ("BF16", [V, H]), prefix + "embed_tokens.weight": ("BF16", [V, H]),
         prefix + "norm.weight": ("BF16", [H])}
    key_dim, val_dim = r["nk"] * r["dk"], r["nv"] * r["dv"]

    def layer(L, full):
        e[L + "input_layernorm.weight"] = ("BF16", [H])
        e[L + "post_attention_layernorm.weight"] = ("BF16", [H])
        if not full:
            a = L + "linear_attn."
            e[a + "in_proj_qkv.weight"] = ("BF16", [2 * key_dim + val_dim, H])
            e[a + "in_proj_z.weight"] = ("BF16", [val_dim, H])
            e[a + "in_proj_b.weight"] = ("BF16", [r["nv"], H])
            e[a + "in_proj_a.weight"] = ("BF16", [r["nv"], H])
            e[a + "conv1d.weight"] = ("BF16", [2 * key_dim + val_dim, 1, 4])
            e[a + "dt_bias"] = ("BF16", [r["nv"]])
            e[a + "A_log"] = ("F32", [r["nv"]])
            e[a + "norm.weight"] = ("BF16", [r["dv"]])
            e[a + "out_proj.weight"] = ("BF16", [H, val_dim])
        else:
            a = L + "self_attn."
            e[a + "q_proj.weight"] = ("BF16", [2 * r["nh"] * r["hd"], H])
            e[a + "k_proj.weight"] = ("BF16", [r["nkv"] * r["hd"], H])
            e[a + "v_proj.weight"] = ("BF16", [r["nkv"] * r["hd"], H])
            e[a + "o_proj.weight"] = ("BF16", [H, r["nh"] * r["hd"]])
            e[a + "q_norm.weight"] = ("BF16", [r["hd"]])
            e[a + "k_norm.weight"] = ("BF16", [r["hd"]])
        m = L + "mlp."
        e[m + "gate.weight"] = ("BF16", [r["E"], H])
        if nvfp4:
            for x in range(r["E"]):
                for proj, (n, k) in (("gate_proj", (r["I"], H)), ("up_proj", (r["I"], H)), ("down_proj", (H, r["I"]))):
                    p = f"{m}experts.{x}.{proj}."
                    e[p + "weight"] = ("U8", [n, k // 2])
                    e[p + "weight_scale"] = ("F8_E4M3", [n, k // 16])
                    e[p + "weight_scale_2"] = ("F32", [])
                    e[p + "input_scale"] = ("F32", [])
        else:
            e[m + "experts.gate_up_proj"] = ("BF16", [r["E"], 2 * r["I"], H])
            e[m + "experts.down_proj"] = ("BF16", [r["E"], H, r["I"]])
        e[m + "shared_expert.gate_proj.weight"] = ("BF16", [r["Is"], H])
        e[m + "shared_expert.up_proj.weight"] = ("BF16", [r["Is"], H])
        e[m + "shared_expert.down_proj.weight"] = ("BF16", [H, r["Is"]])
        e[m + "shared_expert_gate.weight"] = ("BF16", [1, H])

    for i in range(layers):
        layer(f"{prefix}layers.{i}.", (i + 1) % 4 == 0)
    layer("mtp.layers.0.", True)
    e["mtp.fc.weight"] = ("BF16", [H, 2 * H])
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        e[f"mtp.{n}.weight"] = ("BF16", [H])
    return e


def check_against(h, expected):
    got = {k: (v["dtype"], v["shape"]) for k, v in h.items()}
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    assert not missing, f"missing: {missing[:5]}"
    assert not extra, f"unexpected: {extra[:5]}"
    bad = [(k, got[k], expected[k]) for k in expected if got[k] != expected[k]]
    assert not bad, f"wrong dtype/shape: {bad[:5]}"


def pattern_set(names):
    """The tensor-name patterns (layer and expert indices generalized), the MTP head aside (the
    fixture checkpoints have none; expected_qwen35 pins its names)."""
    out = set()
    for k in names:
        if k.startswith("mtp."):
            continue
        k = re.sub(r"layers\.\d+\.", "layers.N.", k)
        out.add(re.sub(r"experts\.\d+\.", "experts.E.", k))
    return out


# ---- written checkpoints shared by several tests --------------------------------

@pytest.fixture
def big_tmp(tmp_path):
    """A folder for multi-GB checkpoints, removed after the test (pytest keeps old tmp_paths)."""
    d = tmp_path / "big"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def out35(tmp_path_factory):
    d = tmp_path_factory.mktemp("s35")
    dt = synth(d, "qwen3.5-35b-a3b", "--layers", "2")
    yield d, dt
    shutil.rmtree(d, ignore_errors=True)


def test_35b_two_layers_written_under_a_minute(out35):
    d, dt = out35
    print(f"synth qwen3.5-35b-a3b --layers 2: {dt:.1f} s")
    assert dt < 60, f"took {dt:.1f} s"


def test_35b_nvfp4_matches_reference_shapes(out35):
    d, _ = out35
    h = all_headers(d)
    check_against(h, expected_qwen35(REF["qwen3.5-35b-a3b"], 2, nvfp4=True))
    g, gs = EXPERT_NVFP4["qwen3.5-35b-a3b"]["gate"]
    w, ws = EXPERT_NVFP4["qwen3.5-35b-a3b"]["down"]
    P = "model.language_model.layers.1.mlp.experts.255."
    assert h[P + "gate_proj.weight"]["shape"] == g and h[P + "gate_proj.weight_scale"]["shape"] == gs
    assert h[P + "down_proj.weight"]["shape"] == w and h[P + "down_proj.weight_scale"]["shape"] == ws
    assert h["model.language_model.layers.0.linear_attn.conv1d.weight"]["shape"][0] == DERIVED_35B["conv_dim"]


def test_35b_config_is_the_official_wrapper_with_quantization(out35):
    d, _ = out35
    cfg = json.load(open(d / "config.json"))
    assert cfg["model_type"] == "qwen3_5_moe"
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    t, r = cfg["text_config"], REF["qwen3.5-35b-a3b"]
    assert t["model_type"] == "qwen3_5_moe_text"
    for key, want in (("hidden_size", r["H"]), ("num_hidden_layers", 2), ("num_attention_heads", r["nh"]),
                      ("num_key_value_heads", r["nkv"]), ("head_dim", r["hd"]), ("linear_num_key_heads", r["nk"]),
                      ("linear_num_value_heads", r["nv"]), ("num_experts", r["E"]), ("num_experts_per_tok", r["k"]),
                      ("moe_intermediate_size", r["I"]), ("shared_expert_intermediate_size", r["Is"]),
                      ("vocab_size", r["V"])):
        assert t[key] == want, key
    assert t["rope_parameters"]["rope_theta"] == r["theta"]
    assert t["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert t["layer_types"] == ["linear_attention", "linear_attention"]
    q = cfg["quantization_config"]
    assert q["quant_method"] == "modelopt" and q["quant_algo"] == "NVFP4" and q["group_size"] == 16
    hq = json.load(open(d / "hf_quant_config.json"))
    assert hq["quantization"]["quant_algo"] == "NVFP4"
    assert hq["quantization"]["exclude_modules"] == q["ignore"]
    gen = json.load(open(d / "generation_config.json"))
    assert gen["eos_token_id"] == [248046, 248044]


def test_35b_logits_run(out35):
    d, _ = out35
    p = run_ls("logits", "--model-path", d, "--ids", "1,2,3", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lg = np.array(json.loads(p.stdout)["logits"])
    assert lg.shape == (3, 248320)
    assert np.isfinite(lg).all() and lg.std() > 0.1, "degenerate logits"


def test_written_file_loads_in_hf_safetensors(out35):
    safetensors = pytest.importorskip("safetensors")
    d, _ = out35
    with safetensors.safe_open(str(d / "model.safetensors"), "np") as f:
        a = f.get_tensor("model.language_model.layers.0.linear_attn.A_log")
        s2 = f.get_tensor("model.language_model.layers.0.mlp.experts.7.up_proj.weight_scale_2")
        codes = f.get_tensor("model.language_model.layers.0.mlp.experts.7.up_proj.weight")
    assert a.dtype == np.float32 and ((a > 0) & (a < np.log(16) + 1e-6)).all(), "A_log = log(U(1,16))"
    assert s2.shape == () and 0 < float(s2) < 1
    assert codes.dtype == np.uint8 and len(np.unique(codes & 15)) == 16, "all 16 E2M1 codes appear"


def test_other_presets_match_reference_and_fixture_layout(big_tmp):
    """qwen3-30b-a3b (BF16 per-expert, model.*), qwen3-next (NVFP4 per-expert,
    fused in_proj_qkvz/in_proj_ba), qwen3.5 BF16 (fused 3-D experts): shapes
    from the public configs, names as the transformers fixtures have them."""
    shared = os.path.join(SHARED, "fixtures", "models")
    # qwen3-30b-a3b, 1 layer
    d = big_tmp / "q30"
    synth(d, "qwen3-30b-a3b", "--layers", "1")
    h, r = all_headers(d), REF["qwen3-30b-a3b"]
    H = r["H"]
    assert h["model.embed_tokens.weight"]["shape"] == [r["V"], H]
    assert h["model.layers.0.self_attn.q_proj.weight"]["shape"] == [r["nh"] * r["hd"], H]
    assert h["model.layers.0.self_attn.k_proj.weight"]["shape"] == [r["nkv"] * r["hd"], H]
    assert h["model.layers.0.self_attn.q_norm.weight"]["shape"] == [r["hd"]]
    assert h["model.layers.0.mlp.gate.weight"]["shape"] == [r["E"], H]
    t = h["model.layers.0.mlp.experts.127.down_proj.weight"]
    assert (t["dtype"], t["shape"]) == ("BF16", [H, r["I"]])
    cfg = json.load(open(d / "config.json"))
    assert cfg["model_type"] == "qwen3_moe" and cfg["num_experts"] == 128 and cfg["rope_theta"] == 1e6
    if os.path.isdir(shared):
        assert pattern_set(h) == pattern_set(header(os.path.join(shared, "qwen3_moe", "model.safetensors")))
    shutil.rmtree(d)

    # qwen3-235b-a22b, 1 layer, NVFP4 experts (its 128 experts of [1536 x 4096]: ~1.4 GB)
    d = big_tmp / "q235"
    synth(d, "qwen3-235b-a22b", "--layers", "1", "--quant", "nvfp4")
    h, r = all_headers(d), REF["qwen3-235b-a22b"]
    H = r["H"]
    assert h["model.layers.0.self_attn.q_proj.weight"]["shape"] == [r["nh"] * r["hd"], H]
    assert h["model.layers.0.self_attn.k_proj.weight"]["shape"] == [r["nkv"] * r["hd"], H]
    assert h["model.layers.0.mlp.gate.weight"]["shape"] == [r["E"], H]
    t = h["model.layers.0.mlp.experts.127.gate_proj.weight"]
    assert (t["dtype"], t["shape"]) == ("U8", [r["I"], H // 2])
    t = h["model.layers.0.mlp.experts.0.down_proj.weight_scale"]
    assert (t["dtype"], t["shape"]) == ("F8_E4M3", [H, r["I"] // 16])
    cfg = json.load(open(d / "config.json"))
    assert (cfg["model_type"], cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"],
            cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
            cfg["rope_theta"], cfg["vocab_size"]) == ("qwen3_moe", r["E"], r["k"], r["I"], 1, r["nh"], r["nkv"],
                                                       r["hd"], r["theta"], r["V"])
    shutil.rmtree(d)

    # qwen3-next, 1 layer (a GDN layer), NVFP4 experts
    d = big_tmp / "next"
    synth(d, "qwen3-next-80b-a3b", "--layers", "1", "--quant", "nvfp4")
    h, r = all_headers(d), REF["qwen3-next-80b-a3b"]
    H, kd, vd = r["H"], r["nk"] * r["dk"], r["nv"] * r["dv"]
    assert h["model.layers.0.linear_attn.in_proj_qkvz.weight"]["shape"] == [2 * kd + 2 * vd, H]
    assert h["model.layers.0.linear_attn.in_proj_ba.weight"]["shape"] == [2 * r["nv"], H]
    assert h["model.layers.0.linear_attn.conv1d.weight"]["shape"] == [2 * kd + vd, 1, 4]
    assert h["model.layers.0.mlp.experts.511.gate_proj.weight"]["shape"] == [r["I"], H // 2]
    assert h["model.layers.0.mlp.shared_expert.up_proj.weight"]["shape"] == [r["Is"], H]
    assert h["lm_head.weight"]["shape"] == [r["V"], H]
    cfg = json.load(open(d / "config.json"))
    assert cfg["model_type"] == "qwen3_next" and cfg["num_experts"] == 512 and cfg["num_experts_per_tok"] == 10
    if os.path.isdir(shared):
        assert pattern_set(h) <= pattern_set(header(os.path.join(shared, "qwen3_next-nvfp4", "model.safetensors")))
    shutil.rmtree(d)

    # qwen3.5 BF16: the fused layout, checked on the demo sizes (4 layers)
    d = big_tmp / "fused"
    synth(d, "demo", "--quant", "bf16", "--layers", "4")
    h = all_headers(d)
    check_against(h, expected_qwen35(REF["demo"], 4, nvfp4=False))
    assert "quantization_config" not in json.load(open(d / "config.json"))
    if os.path.isdir(shared):
        assert pattern_set(h) == pattern_set(header(os.path.join(shared, "qwen3_5_moe-fused", "model.safetensors")))


def test_122b_one_layer_matches_reference(big_tmp):
    d = big_tmp / "s122"
    synth(d, "qwen3.5-122b-a10b", "--layers", "1")
    h = all_headers(d)
    check_against(h, expected_qwen35(REF["qwen3.5-122b-a10b"], 1, nvfp4=True))
    (g, gs), (w, ws) = EXPERT_NVFP4["qwen3.5-122b-a10b"]["gate"], EXPERT_NVFP4["qwen3.5-122b-a10b"]["down"]
    P = "model.language_model.layers.0.mlp.experts.0."
    assert [h[P + "up_proj.weight"]["shape"], h[P + "up_proj.weight_scale"]["shape"]] == [g, gs]
    assert [h[P + "down_proj.weight"]["shape"], h[P + "down_proj.weight_scale"]["shape"]] == [w, ws]


# ---- the demo model ----------------------------------------------------------------

def test_demo_matches_its_own_table_and_fixture_names(demo_model):
    h = all_headers(demo_model)
    check_against(h, expected_qwen35(REF["demo"], 8, nvfp4=True))
    shared = os.path.join(SHARED, "fixtures", "models")
    if os.path.isdir(shared):
        assert pattern_set(h) <= pattern_set(header(os.path.join(shared, "qwen3_5_moe-nvfp4", "model.safetensors")))


def test_demo_is_deterministic_and_seed_changes_weights(demo_model, tmp_path):
    synth(tmp_path / "a", "demo")
    for fn in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        assert open(tmp_path / "a" / fn, "rb").read() == open(os.path.join(demo_model, fn), "rb").read(), fn
    synth(tmp_path / "b", "demo", "--seed", "7")
    assert open(tmp_path / "b" / "model.safetensors", "rb").read() != open(tmp_path / "a" / "model.safetensors", "rb").read()


def test_demo_tokenizer_loads_in_hf_tokenizers(demo_model):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(os.path.join(demo_model, "tokenizer.json"))
    cfg = json.load(open(os.path.join(demo_model, "config.json")))["text_config"]
    assert tok.get_vocab_size() == cfg["vocab_size"] == 4096
    gen = json.load(open(os.path.join(demo_model, "generation_config.json")))
    assert gen["eos_token_id"] == [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    assert cfg["eos_token_id"] == tok.token_to_id("<|endoftext|>")
    for text in ["Hello, world! The quick brown fox.", "你好，世界！こんにちは", "नमस्ते! आप कैसे हैं?",
                 "def f(x):\n    return x**2  # 123456\n\n", "Übung macht den Meister. Ça va?  \t tabs",
                 "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n"]:
        enc = tok.encode(text, add_special_tokens=False)
        assert tok.decode(enc.ids, skip_special_tokens=False) == text
    # the Qwen3.5 added tokens and their special flags
    j = json.load(open(os.path.join(demo_model, "tokenizer.json")))
    flags = {a["content"]: a["special"] for a in j["added_tokens"]}
    assert flags["<|im_end|>"] and flags["<|endoftext|>"] and flags["<|im_start|>"]
    assert not flags["<think>"] and not flags["</tool_call>"] and not flags["<tool_response>"]
    assert len(flags) == 33
    assert j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].count(r"\p{M}") == 2
    # common words became single tokens
    assert len(tok.encode(" the", add_special_tokens=False).ids) == 1
    tc = json.load(open(os.path.join(demo_model, "tokenizer_config.json")))
    assert tc["eos_token"] == "<|im_end|>" and tc["pad_token"] == "<|endoftext|>" and tc["bos_token"] is None


def render(template_path, **kw):
    jinja2 = pytest.importorskip("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(m):
        raise jinja2.exceptions.TemplateError(m)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(open(template_path).read()).render(**kw)


def test_demo_chat_template_has_qwen35_behaviour(demo_model):
    t = os.path.join(demo_model, "chat_template.jinja")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(t, messages=msgs, add_generation_prompt=True) == \
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert render(t, messages=msgs, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    conv = [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
             "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                              "arguments": {"city": "Oslo", "days": [1, 2]}}}]},
            {"role": "tool", "content": "rain"}, {"role": "tool", "content": "5C"}]
    out = render(t, messages=conv, tools=tools, add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
                          + json.dumps(tools[0]) + "\n</tools>")
    assert ("<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n[1, 2]\n</parameter>\n</function>\n"
            "</tool_call><|im_end|>\n") in out
    assert ("<|im_start|>user\n<tool_response>\nrain\n</tool_response>\n<tool_response>\n5C\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n<think>\n") in out
    # reasoning before the last user query is dropped
    hist = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nold\n</think>\n\nb"},
            {"role": "user", "content": "c"}]
    assert "old" not in render(t, messages=hist, add_generation_prompt=True)
    jinja2 = pytest.importorskip("jinja2")
    with pytest.raises(jinja2.exceptions.TemplateError, match="System message must be at the beginning"):
        render(t, messages=[{"role": "user", "content": "a"}, {"role": "system", "content": "x"}])


def test_demo_template_agrees_with_official_qwen35_without_tools(demo_model, shared_dir):
    """Conversations without tools render exactly as the official Qwen3.5 template renders them
    (transformers' output in the fixtures)."""
    cases = json.load(open(os.path.join(shared_dir, "fixtures", "tokenizer-qwen3", "chat_template_qwen3.5.json")))
    n = 0
    for c in cases:
        if c.get("tools") or "error" in c:
            continue
        kw = dict(messages=c["messages"], add_generation_prompt=c.get("add_generation_prompt", False),
                  **(c.get("chat_template_kwargs") or {}))
        assert render(os.path.join(demo_model, "chat_template.jinja"), **kw) == c["text"]
        n += 1
    assert n >= 5


def test_in_memory_synth_equals_written_demo(demo_model):
    a = run_ls("logits", "--model-path", demo_model, "--ids", "5,6,7", timeout=120)
    b = run_ls("logits", "--model-path", "synth:demo", "--ids", "5,6,7", timeout=120)
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    assert json.loads(a.stdout)["logits"] == json.loads(b.stdout)["logits"]


# ---- flag validation -----------------------------------------------------------------

@pytest.mark.parametrize("args,flag", [
    (["--preset", "demo"], "--out"),
    (["--out", "/tmp/x"], "--preset"),
    (["--preset", "llama-7b", "--out", "/tmp/x"], "--preset"),
    (["--preset", "demo", "--out", "/tmp/x", "--layers", "0"], "--layers"),
    (["--preset", "demo", "--out", "/tmp/x", "--layers", "two"], "--layers"),
    (["--preset", "demo", "--out", "/tmp/x", "--seed", "-1"], "--seed"),
    (["--preset", "demo", "--out", "/tmp/x", "--quant", "int4"], "--quant"),
    (["--preset", "demo", "--out", "/tmp/x", "--bogus"], "--bogus"),
    (["--preset", "demo", "--out", "/etc/hostname"], "--out"),
])
def test_synth_bad_flags_exit_2_naming_the_flag(args, flag):
    p = run_ls("synth", *args)
    assert p.returncode == 2 and flag in p.stderr, p.stderr


def test_synth_help():
    p = run_ls("synth", "--help")
    assert p.returncode == 0 and "--preset" in p.stdout and "qwen3.5-397b-a17b" in p.stdout


@pytest.mark.parametrize("args,flag", [
    (["--out", "/tmp/x"], "--in"),
    (["--in", "/nonexistent-dir", "--out", "/tmp/x"], "--in"),
    (["--in", "/tmp"], "--out"),
    (["--in", "/tmp", "--out", "/tmp/x", "--exclude"], "--exclude"),
    (["--in", "/tmp", "--out", "/tmp/"], "--out"),
])
def test_quantize_bad_flags_exit_2_naming_the_flag(args, flag):
    p = run_ls("quantize", *args)
    assert p.returncode == 2 and flag in p.stderr, p.stderr


# ---- quantize -------------------------------------------------------------------------

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e4m3_values():
    c = np.arange(127)
    e, m = c >> 3, c & 7
    return np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0)).astype(np.float32)


def ref_nvfp4(w):
    """ModelOpt NVFP4 of w [N, K] (float32), reference section 4.6: returns (codes [N,K] uint8, scale codes
    [N,K/16] uint8, scale_2)."""
    s2 = np.float32(np.abs(w).max() / np.float32(6 * 448))
    blocks = w.reshape(w.shape[0], -1, 16)
    want = (np.abs(blocks).max(-1) / np.float32(6)) / s2
    table = e4m3_values()
    idx = np.clip(np.searchsorted(table, want, side="right") - 1, 0, 125)
    lo, hi = table[idx], table[idx + 1]
    dl, dh = want - lo, hi - want
    sc = np.where(dl < dh, idx, np.where(dh < dl, idx + 1, np.where(idx % 2 == 0, idx, idx + 1)))
    sc = np.where(want >= 448, 126, sc).astype(np.uint8)
    bs = table[sc] * s2
    x = np.where(bs[..., None] > 0, blocks / bs[..., None], 0).reshape(w.shape)
    a = np.abs(x)
    mag = np.select([a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5.0], [0, 1, 2, 3, 4, 5, 6], 7)
    codes = (mag | np.where(x < 0, 8, 0)).astype(np.uint8)
    return codes, sc, s2


def bf16(t):
    return (np.frombuffer(t[2], np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t[1])


def test_quantize_matches_numpy_modelopt_reference(tmp_path):
    src, dst = tmp_path / "bf16", tmp_path / "nvfp4"
    synth(src, "demo", "--quant", "bf16", "--layers", "4")
    p = run_ls("quantize", "--in", src, "--out", dst, "--exclude", "*layers.3.self_attn.o_proj")
    assert p.returncode == 0, p.stderr
    A, B = load_tensors(src / "model.safetensors"), load_tensors(dst / "model.safetensors")
    L = "model.language_model.layers."
    gu = bf16(A[L + "3.mlp.experts.gate_up_proj"])  # [E, 2I, H]
    dn = bf16(A[L + "3.mlp.experts.down_proj"])     # [E, H, I]
    I = gu.shape[1] // 2
    checks = {L + "3.mlp.experts.5.gate_proj": gu[5, :I], L + "3.mlp.experts.5.up_proj": gu[5, I:],
              L + "3.mlp.experts.15.down_proj": dn[15], L + "3.self_attn.q_proj": bf16(A[L + "3.self_attn.q_proj.weight"]),
              L + "0.mlp.shared_expert.down_proj": bf16(A[L + "0.mlp.shared_expert.down_proj.weight"])}
    for mod, w in checks.items():
        codes, sc, s2 = ref_nvfp4(w)
        assert B[mod + ".weight"][:2] == ("U8", [w.shape[0], w.shape[1] // 2])
        got = np.frombuffer(B[mod + ".weight"][2], np.uint8).reshape(w.shape[0], -1)
        got = np.stack([got & 15, got >> 4], -1).reshape(w.shape)
        assert np.frombuffer(B[mod + ".weight_scale_2"][2], np.float32)[0] == s2, mod
        assert (np.frombuffer(B[mod + ".weight_scale"][2], np.uint8).reshape(sc.shape) == sc).all(), mod
        # codes equal, except +0/-0 which dequantize identically
        assert (E2M1[got] == E2M1[codes]).all(), mod
        deq = E2M1[got] * np.repeat(e4m3_values()[sc], 16, axis=1) * s2
        rel = np.sqrt(((deq - w) ** 2).mean() / (w ** 2).mean())
        assert rel < 0.15, (mod, rel)
        assert B[mod + ".input_scale"][:2] == ("F32", [])
    # kept in BF16, byte for byte: routers, GDN, norms, embeddings, lm_head, the excluded module
    for k in ("lm_head.weight", "model.language_model.embed_tokens.weight", L + "0.mlp.gate.weight",
              L + "0.mlp.shared_expert_gate.weight", L + "0.linear_attn.in_proj_qkv.weight", L + "0.linear_attn.A_log",
              L + "0.linear_attn.conv1d.weight", L + "3.self_attn.q_norm.weight", L + "3.self_attn.o_proj.weight"):
        assert B[k] == A[k], k
    assert L + "3.mlp.experts.gate_up_proj" not in B
    cfg = json.load(open(dst / "config.json"))
    assert cfg["quantization_config"]["quant_algo"] == "NVFP4"
    assert "*layers.3.self_attn.o_proj" in cfg["quantization_config"]["ignore"]
    hq = json.load(open(dst / "hf_quant_config.json"))
    assert hq["quantization"]["exclude_modules"] == cfg["quantization_config"]["ignore"]
    assert os.path.exists(dst / "tokenizer.json") and os.path.exists(dst / "chat_template.jinja")
    # the quantized model runs
    p = run_ls("logits", "--model-path", dst, "--ids", "1,2,3", timeout=120)
    assert p.returncode == 0, p.stderr
    assert np.isfinite(np.array(json.loads(p.stdout)["logits"])).all()


def test_quantize_refuses_a_quantized_checkpoint(demo_model, tmp_path):
    p = run_ls("quantize", "--in", demo_model, "--out", tmp_path / "q")
    assert p.returncode == 2 and "config.json" in p.stderr and "already quantized" in p.stderr


# ---- the 397B preset in memory (about 10 GB of RAM; runs once) -------------------------

def test_397b_one_layer_in_memory_runs_one_token():
    t0 = time.time()
    p = run_ls("logits", "--model-path", "synth:qwen3.5-397b-a17b,layers=1", "--ids", "1", timeout=600)
    dt = time.time() - t0
    assert p.returncode == 0, p.stderr[-3000:]
    lg = np.array(json.loads(p.stdout)["logits"])
    assert lg.shape == (1, 248320) and np.isfinite(lg).all() and lg.std() > 0.1
    rss_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6
    print(f"397B layers=1 in memory, one token: {dt:.1f} s, max child RSS {rss_gb:.1f} GB")


def test_full_397b_in_memory_is_refused_not_crashed():
    """The full 397B (237 GB) cannot be built in this machine's memory: a clear error, no OOM kill."""
    mem_kb = int(re.search(r"MemTotal:\s+(\d+)", open("/proc/meminfo").read()).group(1))
    if mem_kb > 200e6:
        pytest.skip("this machine could actually build it")
    p = run_ls("logits", "--model-path", "synth:qwen3.5-397b-a17b", "--ids", "1", timeout=120)
    assert p.returncode in (1, 2), p.stderr
    assert "layers=N" in p.stderr and "GB" in p.stderr


@pytest.mark.parametrize("model,quantized", [("qwen3_moe", "qwen3_moe-nvfp4"), ("qwen3_next", "qwen3_next-nvfp4"),
                                             ("qwen3_5_moe_text", "qwen3_5_moe_text-nvfp4"),
                                             ("qwen3_5_moe-fused", "qwen3_5_moe-nvfp4")])
def test_quantize_reproduces_the_fixture_quantization(model, quantized, shared_dir, tmp_path):
    """The NVFP4 fixtures were quantized by torch (../shared/tools/gen_fixtures.py) from the BF16 fixtures:
    quantize must give the same tensor names, byte-identical weight_scale and weight_scale_2, and the
    same E2M1 codes except at exact ties between two code values, where the fixture takes the smaller
    magnitude and we round to even (reference 4.6, what the hardware cvt.rn does). The fused BF16
    release layout (experts.gate_up_proj [E, 2I, H]) must split into the per-expert NVFP4 tensors."""
    src = os.path.join(shared_dir, "fixtures", "models", model)
    p = run_ls("quantize", "--in", src, "--out", tmp_path / "q")
    assert p.returncode == 0, p.stderr
    A = load_tensors(tmp_path / "q" / "model.safetensors")
    B = load_tensors(os.path.join(shared_dir, "fixtures", "models", quantized, "model.safetensors"))
    S = load_tensors(os.path.join(src, "model.safetensors"))
    for k in [k for k in S if k.endswith("mlp.experts.gate_up_proj")]:  # fused -> per expert, as BF16 views
        g = S.pop(k)
        E, I2, H = g[1]
        down = S.pop(k.replace("gate_up_proj", "down_proj"))
        per, dper = len(g[2]) // E, len(down[2]) // E
        for e in range(E):
            blob = g[2][e * per:(e + 1) * per]
            S[f"{k[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = ("BF16", [I2 // 2, H], blob[:per // 2])
            S[f"{k[:-len('gate_up_proj')]}{e}.up_proj.weight"] = ("BF16", [I2 // 2, H], blob[per // 2:])
            S[f"{k[:-len('gate_up_proj')]}{e}.down_proj.weight"] = ("BF16", down[1][1:], down[2][e * dper:(e + 1) * dper])
    assert set(A) == set(B)
    table = e4m3_values()
    ties = 0
    for k in B:
        if k.endswith(".weight_scale") or k.endswith(".weight_scale_2"):
            assert A[k] == B[k], k
        elif B[k][0] != "U8":
            if not k.endswith("input_scale"):
                assert A[k] == B[k], k  # kept tensors are untouched
        elif A[k] != B[k]:
            mod = k[: -len(".weight")]
            w = bf16(S[k])
            s2 = np.frombuffer(A[mod + ".weight_scale_2"][2], np.float32)[0]
            sc = np.frombuffer(A[mod + ".weight_scale"][2], np.uint8).reshape(w.shape[0], -1)
            x = (w.reshape(w.shape[0], -1, 16) / (table[sc] * s2)[..., None]).reshape(w.shape)
            ours = np.frombuffer(A[k][2], np.uint8).reshape(w.shape[0], -1)
            theirs = np.frombuffer(B[k][2], np.uint8).reshape(w.shape[0], -1)
            ours = np.stack([ours & 15, ours >> 4], -1).reshape(w.shape)
            theirs = np.stack([theirs & 15, theirs >> 4], -1).reshape(w.shape)
            d = ours != theirs
            assert np.isin(np.abs(x[d]), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]).all(), f"{k}: not a tie"
            assert ((ours[d] & 7) % 2 == 0).all(), f"{k}: tie not rounded to even"
            ties += int(d.sum())
    print(f"{model}: {ties} codes differ, all at exact ties")
