"""The oracle for tests/test_mtp_head.py: the multi-token-prediction (MTP) head's fp32 logits on the
Qwen3.5 / Qwen3-Next fixtures, computed with Hugging Face transformers' own modules.

    python3 tests/tools/gen_mtp_ref.py [OUT_JSON]     (default tests/fixtures/mtp_ref.json)

Needs torch and transformers (the GPU machine's python3; the CPU is enough: every tensor is fp32 on
the CPU). The fixtures come from $LS_SHARED/fixtures/models, else ../shared/fixtures/models beside
the checkout. Per fixture:
  - the MTP head is made with tests/mtp_fixture.py (the bytes laststand reads too);
  - main = the fixture itself (its own folder: transformers never sees the mtp.* tensors), in fp32;
    hid = main.model(ids).last_hidden_state[0] (after the final norm);
  - the head's decoder layer is the text model's own class: a one-layer checkpoint (config:
    num_hidden_layers 1, layer_types [full_attention]; tensors: model.layers.0.* = mtp.layers.0.*,
    model.norm = mtp.norm, the fixture's embedding and lm_head) loaded by from_pretrained, so that
    transformers' own key conversion (per-expert tensors -> fused experts) applies, exactly as for
    the fixture. The same path fed the fixture's own layer 3 must reproduce main.model.layers[3]'s
    parameters bit for bit (checked);
  - row i (i = 0 .. T-2): e = pre_fc_norm_embedding(embed(ids[i+1])), h = pre_fc_norm_hidden(hid[i])
    (both the model's zero-centred RMSNorm class), x = cat(e, h) @ mtp.fc.T, then the one-layer
    model over x (inputs_embeds) at positions 0 .. T-2, causal, then its norm (= mtp.norm), then
    main.lm_head.
Checks printed and asserted: the fixture's ref.json logits are reproduced by main (1e-4), the
loading path above, and the head's causality (a prefix of ids gives the same first rows).
Without torch it still builds the MTP checkpoints and prints what it would compute (exit 3)."""
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)
import mtp_fixture  # noqa: E402

SEED = 1234
IDS = [5, 77, 301, 12, 999, 64, 512, 8, 3, 700, 41, 250]
CASES = ["qwen3_5_moe_text", "qwen3_next"]
SHARED = os.path.abspath(os.environ.get("LS_SHARED") or os.path.join(ROOT, "..", "shared"))
MODELS = os.path.join(SHARED, "fixtures", "models")


def one_layer_checkpoint(src_dir, dst_dir, layer, norm):
    """A one-layer (full-attention) checkpoint of src_dir's text model in dst_dir: layer
    {suffix: array} as model.layers.0.*, norm as model.norm.weight, src's embedding and lm_head.
    BF16 on disk (the values given are BF16 values: exact)."""
    os.makedirs(dst_dir, exist_ok=True)
    with open(os.path.join(src_dir, "config.json")) as f:
        cfg = json.load(f)
    tc = mtp_fixture.text_config(cfg)
    tc["num_hidden_layers"] = 1
    tc["layer_types"] = ["full_attention"]
    tc["mlp_only_layers"] = []
    with open(os.path.join(dst_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    glob = mtp_fixture.read_st_f32(os.path.join(src_dir, "model.safetensors"),
                                   {"model.embed_tokens.weight", "lm_head.weight"})
    t = dict(glob)
    t["model.norm.weight"] = norm
    for suffix, a in layer.items():
        t["model.layers.0." + suffix] = a
    mtp_fixture.write_st_bf16(os.path.join(dst_dir, "model.safetensors"), t)


def rel_rows(a, b):
    return (np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max()


def f32_list(a):
    """Rows of a float32 array as lists of the shortest decimals that read back as the same float32."""
    return [[float(str(np.float32(v))) for v in row] for row in np.asarray(a, dtype=np.float32)]


def load_one_layer(torch, AutoModelForCausalLM, d, main):
    m, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                                   output_loading_info=True)
    m.eval()
    bad = {k: sorted(map(str, info.get(k) or ())) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(bad.values()):
        raise SystemExit(f"{d}: the one-layer checkpoint did not load cleanly: {bad}")
    if type(m.model) is not type(main.model):
        raise SystemExit(f"{d}: loaded {type(m.model).__name__}, the fixture is {type(main.model).__name__}")
    return m.model


def run_case(torch, transformers, name, work):
    from transformers import AutoModelForCausalLM
    src = os.path.join(MODELS, name)
    mtp_dir = os.path.join(work, name + "-mtp")
    head = mtp_fixture.make_mtp_checkpoint(src, mtp_dir, seed=SEED)
    # what transformers computes with: the head's tensors as written (read back from the file)
    head_disk = mtp_fixture.read_st_f32(os.path.join(mtp_dir, "mtp.safetensors"))
    assert set(head_disk) == set(head) and all((head_disk[k] == head[k]).all() for k in head)

    main = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = main.config
    H, eps = cfg.hidden_size, cfg.rms_norm_eps

    with torch.no_grad():
        # 1. the fixture's own oracle is reproduced (the same transformers, the same weights)
        ref_path = os.path.join(src, "ref.json")
        if os.path.exists(ref_path):
            with open(ref_path) as f:
                r = json.load(f)
            if "logits" in r and "input_ids" in r:
                lg = main(input_ids=torch.tensor([r["input_ids"]])).logits[0].numpy()
                e = rel_rows(lg.astype(np.float64), np.array(r["logits"], dtype=np.float64))
                print(f"  {name}: ref.json logits reproduced to {e:.3g} (transformers {r.get('transformers')})")
                assert e < 1e-4, f"{name}: main model does not reproduce ref.json ({e:.3g})"
        else:
            print(f"  {name}: no ref.json, self-check skipped")

        # 2. the one-layer loading path: the fixture's own layer 3 through it equals main's layer 3
        src_st = mtp_fixture.read_st_f32(os.path.join(src, "model.safetensors"))
        pre = next(p for p in ("model.layers.3.", "model.language_model.layers.3.") if any(k.startswith(p) for k in src_st))
        l3 = {k[len(pre):]: v for k, v in src_st.items() if k.startswith(pre)}
        chk_dir = os.path.join(work, name + "-layer3")
        one_layer_checkpoint(src, chk_dir, l3, src_st[pre[:-len("layers.3.")] + "norm.weight"])
        chk = load_one_layer(torch, AutoModelForCausalLM, chk_dir, main)
        want, got = main.model.layers[3].state_dict(), chk.layers[0].state_dict()
        assert set(want) == set(got), (sorted(want), sorted(got))
        for k in want:
            assert torch.equal(want[k], got[k]), f"{name}: layer-3 round trip differs at {k}"
        print(f"  {name}: one-layer loading path reproduces layer 3 ({len(want)} tensors)")

        # 3. the head
        layer = {k[len("mtp.layers.0."):]: v for k, v in head.items() if k.startswith("mtp.layers.0.")}
        mtp_ckpt = os.path.join(work, name + "-mtp-layer")
        one_layer_checkpoint(src, mtp_ckpt, layer, head["mtp.norm.weight"])
        mtp_model = load_one_layer(torch, AutoModelForCausalLM, mtp_ckpt, main)
        NormCls = type(main.model.norm)
        norm_e, norm_h = NormCls(H, eps=eps).float(), NormCls(H, eps=eps).float()
        norm_e.weight.copy_(torch.from_numpy(head["mtp.pre_fc_norm_embedding.weight"]))
        norm_h.weight.copy_(torch.from_numpy(head["mtp.pre_fc_norm_hidden.weight"]))
        fc = torch.from_numpy(head["mtp.fc.weight"])  # [H, 2H]: embedding half first

        def mtp_logits(ids):
            T = len(ids)
            hid = main.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # [T, H], final-normed
            emb = main.model.embed_tokens(torch.tensor(ids[1:]))                    # [T-1, H]
            x = torch.cat([norm_e(emb), norm_h(hid[:-1])], dim=-1) @ fc.T           # [T-1, H]
            try:
                out = mtp_model(inputs_embeds=x[None], position_ids=torch.arange(T - 1)[None],
                                use_cache=False).last_hidden_state[0]
            except Exception as ex:  # a model that wants its own position ids: positions 0.. by default
                print(f"  {name}: position_ids [1, T-1] refused ({type(ex).__name__}: {ex}); without them")
                out = mtp_model(inputs_embeds=x[None], use_cache=False).last_hidden_state[0]
            return main.lm_head(out).numpy().astype(np.float32)

        ref = mtp_logits(IDS)
        # 4. causality: a prefix of the ids gives the same first rows
        k = 7
        e = rel_rows(mtp_logits(IDS[:k]).astype(np.float64), ref[:k - 1].astype(np.float64))
        assert e < 1e-5, f"{name}: MTP rows of a prefix differ ({e:.3g})"
    srt = np.sort(ref, axis=1)
    margin = srt[:, -1] - srt[:, -2]
    print(f"  {name}: MTP logits {ref.shape}, max|ref| {np.abs(ref).max():.4g}, argmax {ref.argmax(1).tolist()}, "
          f"top-2 margins min {margin.min():.3g}; prefix rows agree to {e:.3g}")
    return {"ids": IDS, "logits": f32_list(ref)}


def main_():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(TESTS, "fixtures", "mtp_ref.json")
    missing = [c for c in CASES if not os.path.isdir(os.path.join(MODELS, c))]
    if missing:
        raise SystemExit(f"fixtures missing under {MODELS}: {missing} (set LS_SHARED)")
    try:
        import torch
        import transformers
    except ImportError as ex:
        with tempfile.TemporaryDirectory() as work:
            for c in CASES:
                t = mtp_fixture.make_mtp_checkpoint(os.path.join(MODELS, c), os.path.join(work, c), seed=SEED)
                print(f"  {c}: MTP head built, {len(t)} tensors, mtp.fc {t['mtp.fc.weight'].shape}")
        print(f"no torch / transformers here ({ex}): would compute {len(CASES)} x {len(IDS) - 1} rows into {out}")
        sys.exit(3)
    torch.set_grad_enabled(False)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, fixtures {MODELS}")
    res = {"transformers": transformers.__version__, "torch": torch.__version__, "seed": SEED,
           "ids_rule": "row i predicts ids[i+2] from last_hidden_state[i] and ids[i+1]", "cases": {}}
    with tempfile.TemporaryDirectory() as work:
        for c in CASES:
            res["cases"][c] = run_case(torch, transformers, c, work)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main_()
