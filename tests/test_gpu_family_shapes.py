"""Every CUDA backend of every family at the layer shapes of the family's other full-size members,
by the doctor on a GPU; skipped without one.

The 35B and 397B shapes are pinned by the per-backend tests; S13 served the 122B for the first
time and the doctor found cuda_fused_decode crashing at M = 8 there ("invalid argument": the
router kernel's 48 KB of staged x plus its static shared memory, over the default limit its
launcher assumed to be 48 KB). This file pins the other shapes: the doctor's verdict of every
backend that is not test-only, at decode and prefill buckets, is "ok" (right against the fp64
CPU reference) or "unsupported" (declined with a reason), never a crash or a wrong result:
- synth:qwen3.5-122b-a10b (hidden 3072: 24 chunks of 128, neither of the MoE's streaming
  kernel-pair widths; 256 experts top-8, I 1024, BF16 shared expert of 1024);
- synth:qwen3-next-80b-a3b,quant=nvfp4 (512 experts top-10, I 512; Qwen3-Next's GDN);
- synth:qwen3-30b-a3b,quant=nvfp4 (128 experts top-8, I 768, no shared expert; 4 KV heads);
- synth:qwen3-235b-a22b,quant=nvfp4 (hidden 4096, 64 q / 4 KV heads, 128 experts top-8, I 1536).
"""
import json
import os
import subprocess

import pytest

from conftest import BIN, requires_gpu

pytestmark = requires_gpu


@pytest.mark.parametrize("preset", ["qwen3.5-122b-a10b", "qwen3-next-80b-a3b,quant=nvfp4",
                                    "qwen3-30b-a3b,quant=nvfp4", "qwen3-235b-a22b,quant=nvfp4"])
def test_doctor_never_crashes_at_the_shapes(tmp_path, preset):
    out = tmp_path / "doctor.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    p = subprocess.run([BIN, "doctor", "--device", "cuda", "--model-path", f"synth:{preset},layers=1",
                        "--m", "1,2,8,16,64", "--json", str(out)], capture_output=True, text=True, env=env,
                       timeout=400)
    assert out.exists(), f"doctor wrote no report (exit {p.returncode}):\n{p.stderr[-3000:]}"
    bad = {}
    n = 0
    for t in json.load(open(out))["tables"]:
        for be, cells in t["cells"].items():
            if be.startswith("cpu_") or "broken" in be:
                continue
            for m, c in cells.items():
                n += 1
                if c["status"] not in ("ok", "unsupported"):
                    bad[f"{t['family']} {be} M={m}"] = f"{c['status']}: {c['detail'][:160]}"
    assert n > 20, p.stdout[-2000:]
    assert not bad, "\n".join(f"{k}: {v}" for k, v in bad.items()) + "\n" + p.stdout[-3000:]
