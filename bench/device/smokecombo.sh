#!/usr/bin/env bash
# device-limit: 150
# bench/device/smokecombo.sh BIN OUTDIR: why the start-up smoke test refuses cuda_grouped_gemm +
# cuda_chunked together on the qwen3_next fixture (0.306 > 0.25, S12) while each passes alone.
# `logits` of the fixture's own 24-token prompt (ref.json) for backend combinations, each against
# (a) transformers' fp32 logits (ref.json), (b) the reference combination on CUDA (what the smoke
# test compares with), and the worst-row rel error / argmax agreement; then transformers' own BF16
# run against its fp32 (bench/hf_bf16_check.py's measure) as the yardstick. If the fast
# combination is no further from fp32 than the reference combination and transformers-BF16, the
# 0.306 is two BF16 paths drifting apart on a random model, not a wrong kernel.
. "$(dirname "$0")/lib.sh"
dev_init smokecombo 145 "$@"
timeout -k 3 140 python3 - "$BIN" "$D/fixtures/models" <<'PY'
import json, os, subprocess, sys
import numpy as np
BIN, FIX = sys.argv[1], sys.argv[2]
G = ["--gemm-backend", "cuda_gemv:1,cuda_cublaslt", "--lm-head-backend", "cuda_cublaslt"]
COMBOS = {
    "ref":               ["--moe-runner-backend", "cuda_expert_loop", "--attention-backend", "cuda_naive",
                          "--gdn-backend", "cuda_per_token", "--gemm-backend", "cuda_cublaslt"],
    "grouped+chunked":   ["--moe-runner-backend", "cuda_grouped_gemm", "--attention-backend", "cuda_flash_prefill",
                          "--gdn-backend", "cuda_chunked", *G],
    "grouped+recurrent": ["--moe-runner-backend", "cuda_grouped_gemm", "--attention-backend", "cuda_flash_prefill",
                          "--gdn-backend", "cuda_recurrent", *G],
    "loop+chunked":      ["--moe-runner-backend", "cuda_expert_loop", "--attention-backend", "cuda_flash_prefill",
                          "--gdn-backend", "cuda_chunked", *G],
    "grouped+per_token": ["--moe-runner-backend", "cuda_grouped_gemm", "--attention-backend", "cuda_naive",
                          "--gdn-backend", "cuda_per_token", "--gemm-backend", "cuda_cublaslt"],
    "loop+per_token+fp": ["--moe-runner-backend", "cuda_expert_loop", "--attention-backend", "cuda_flash_prefill",
                          "--gdn-backend", "cuda_per_token", *G],
}
def rel(a, b):
    return float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())
for name in ("qwen3_next", "qwen3_5_moe_text"):
    d = os.path.join(FIX, name)
    ref = json.load(open(os.path.join(d, "ref.json")))
    ids = ",".join(map(str, ref["input_ids"]))
    b = np.array(ref["logits"], dtype=np.float64)
    got = {}
    for tag, fl in COMBOS.items():
        p = subprocess.run([BIN, "logits", "--model-path", d, "--ids", ids, "--device", "cuda", *fl],
                           capture_output=True, text=True, timeout=40)
        if p.returncode:
            print(f"{name:17s} {tag:18s} FAILED: {p.stderr.strip()[-200:]}", flush=True); continue
        got[tag] = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    for tag in ("loop+chunked", "grouped+chunked", "ref"):
        if tag in got:
            a = got[tag]
            pr = np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)
            print(f"{name:17s} {tag:18s} per-row rel vs fp32: " + " ".join(f"{x:.2f}" for x in pr), flush=True)
    for tag, a in got.items():
        r = got.get("ref")
        print(f"{name:17s} {tag:18s} vs fp32 rel {rel(a, b):.3f} argmax {int((a.argmax(1) == b.argmax(1)).sum())}/{len(b)}"
              + (f" | vs CUDA ref rel {rel(a, r):.3f}" if r is not None else ""), flush=True)
try:
    import torch
    from transformers import AutoModelForCausalLM
    for name in ("qwen3_next", "qwen3_5_moe_text"):
        d = os.path.join(FIX, name); ref = json.load(open(os.path.join(d, "ref.json")))
        ids = torch.tensor([ref["input_ids"]], device="cuda"); b = np.array(ref["logits"], dtype=np.float64)
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
        with torch.no_grad():
            a = m(ids).logits[0].double().cpu().numpy()
        print(f"{name:17s} transformers-bf16  vs fp32 rel {rel(a, b):.3f} argmax {int((a.argmax(1) == b.argmax(1)).sum())}/{len(b)}",
              flush=True)
        del m
    # the router's top-k margins in transformers' fp32 run: a token whose k-th and (k+1)-th
    # expert probabilities are closer than BF16 rounding moves them flips its expert set
    for name in ("qwen3_next", "qwen3_5_moe_text"):
        d = os.path.join(FIX, name); ref = json.load(open(os.path.join(d, "ref.json")))
        cfg = json.load(open(os.path.join(d, "config.json")))
        cfg = cfg.get("text_config", cfg)
        k = cfg.get("num_experts_per_tok", 0)
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").cuda().eval()
        rows = []
        def hook(mod, inp, out, rows=rows):  # the router logits from its input and weight
            x = inp[0].reshape(-1, inp[0].shape[-1]).double()
            rows.append((x @ mod.weight.double().t()).cpu())
        hs = [mod.register_forward_hook(hook) for n_, mod in m.named_modules()
              if n_.endswith("mlp.gate") and getattr(mod, "weight", None) is not None]
        with torch.no_grad():
            m(torch.tensor([ref["input_ids"]], device="cuda"))
        for h in hs: h.remove()
        print(f"{name:17s} router hooks {len(rows)} layers, top-{k}", flush=True)
        for li, lg in enumerate(rows):
            p = torch.softmax(lg.double(), -1)
            s, _ = p.sort(-1, descending=True)
            gap = (s[:, k - 1] - s[:, k]) / s[:, k - 1]
            t = int(gap.argmin())
            print(f"{name:17s} layer {li}: min relative top-{k} gap {float(gap[t]):.2e} at token {t}; "
                  f"tokens under 1e-2: {[int(i) for i in (gap < 1e-2).nonzero().flatten()]}", flush=True)
        del m
except Exception as ex:  # transformers missing or the model class unknown: the yardstick is S4's table
    print("transformers yardstick:", repr(ex)[:200])
PY
echo "rc=$? $(el)"
