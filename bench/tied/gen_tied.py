# Tiny random-weight models with tied embeddings (lm_head = embed_tokens), built and run by HF
# transformers (the oracle), in the format of ../shared/fixtures/models (written there by
# ../shared/tools/gen_fixtures.py, which this follows: same sizes, same weight treatment).
#
#   python3 gen_tied.py OUTDIR [SEED]
#
# Writes OUTDIR/qwen3-tied (dense Qwen3, as Qwen3-0.6B/1.7B/4B ship) and OUTDIR/qwen3_moe-tied
# (Qwen3-MoE), each: config.json and model.safetensors from save_pretrained (transformers decides
# which tensors are on disk: with tie_word_embeddings=True there is no lm_head.weight), the weights
# re-cast to BF16; ref.json: input_ids (24 random ids), logits (fp32 [24, vocab], every position,
# 6 significant digits), greedy (the next 12 tokens by greedy decoding with the KV cache), and the
# transformers / torch versions. The reference runs in fp32 on exactly the BF16 weight values.
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

OUT = sys.argv[1]
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 5
V = 1024


def tiny(model_type):
    base = dict(vocab_size=V, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, intermediate_size=96, rms_norm_eps=1e-6,
                max_position_embeddings=4096, tie_word_embeddings=True, initializer_range=0.08,
                rope_theta=10000.0)
    if model_type == "qwen3":
        return base
    return dict(base, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])


def g6(x):  # 6 significant digits, as the shared fixtures hold them
    return float(f"{x:.6g}")


def run(model_type):
    cfg = AutoConfig.for_model(model_type, **tiny(model_type))
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).eval()
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert emb.data_ptr() == head.data_ptr(), "transformers did not tie lm_head to embed_tokens"
    with torch.no_grad():
        for n, p in model.named_parameters():  # a tied weight is listed once
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
            p.copy_(p.bfloat16().float())
    d = os.path.join(OUT, model_type + "-tied")
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    sd = load_file(os.path.join(d, "model.safetensors"))
    print("==", model_type + "-tied", type(model).__name__, "saved tensors:", len(sd),
          "lm_head.weight on disk:", "lm_head.weight" in sd)
    for k in sorted(sd):
        if "layers." not in k or "layers.0." in k and "experts.1" not in k:
            print("  ", k, tuple(sd[k].shape), sd[k].dtype)
    save_file({k: v.bfloat16().contiguous() for k, v in sd.items()},
              os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cj = json.load(open(os.path.join(d, "config.json")))
    print("   config tie_word_embeddings:", cj.get("tie_word_embeddings"))
    T = 24
    ids = torch.randint(0, V, (1, T))
    with torch.no_grad():
        logits = model(ids).logits[0].float()
        gen = model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)[0, T:].tolist()
    ref = {"input_ids": ids[0].tolist(), "logits": [[g6(x) for x in row] for row in logits.tolist()],
           "greedy": gen, "transformers": transformers.__version__, "torch": torch.__version__}
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    top2 = logits.topk(2, dim=1).values
    print("   logits std", float(logits.std()), "min top-2 margin", float((top2[:, 0] - top2[:, 1]).min()),
          "greedy", gen)


torch.manual_seed(SEED)
failed = 0
for mt in ("qwen3", "qwen3_moe"):
    try:
        run(mt)
    except Exception as e:
        import traceback
        traceback.print_exc()
        print("FAILED", mt, e)
        failed += 1
sys.exit(1 if failed else 0)
