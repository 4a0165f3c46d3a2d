# bench/hf_bf16_check.py: how far transformers itself moves in BF16 from its own fp32 reference
# on the fixture models (the yardstick for our CUDA BF16 forward pass). Run on the GPU machine
# with the fixture folders copied beside this script:
#   cp -r ../shared/fixtures/models/{qwen3,qwen3_moe,qwen3_next,qwen3_5_moe_text} DIR/; python3 DIR/hf_bf16_check.py
import json, os, torch
from transformers import AutoModelForCausalLM
D = os.path.dirname(os.path.abspath(__file__))
for name in ["qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_moe_text"]:
    d = os.path.join(D, name); ref = json.load(open(os.path.join(d, "ref.json")))
    ids = torch.tensor([ref["input_ids"]], device="cuda"); b = torch.tensor(ref["logits"], dtype=torch.float64)
    out = {}
    for dt in (torch.float32, torch.bfloat16):
        m = AutoModelForCausalLM.from_pretrained(d, dtype=dt, attn_implementation="eager").cuda().eval()
        with torch.no_grad():
            a = m(ids).logits[0].double().cpu()
        rel = ((a - b).abs().amax(1) / b.abs().amax(1)).max().item()
        am = (a.argmax(1) == b.argmax(1)).sum().item()
        out[str(dt).split(".")[1]] = f"rel {rel:.3g} argmax {am}/24"
        del m
    print(name, out, flush=True)
