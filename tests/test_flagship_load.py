"""The streamed model load (model.c load_layers, synth_src) and the memory plan (model_plan.c,
`serve --dry-run`), on the CPU.

Pinned behaviour:
- `serve --dry-run` plans the full-size Qwen3.5-397B-A17B NVFP4 from its config and tensor headers
  alone (nothing generated): the weights per GPU at --tp 2 equal this file's own count from the
  published shapes and the slicing rules of model_tp.c (embedding, lm_head, norms, router and
  shared-expert gate whole on every rank, everything else split in two; 1-D parameters and conv1d
  as fp32; 256-byte aligned pieces), ~112.4 GiB; at --tp 1 the verdict is DOES NOT FIT (exit 1)
  on a 140.4 GiB GPU; a bad model path exits 2 naming it.
- a model loaded layer by layer with --tp 2 gives the same logits as --tp 1 (which keeps the
  whole checkpoint in memory), and its host memory peak (VmHWM, logged by model_open) stays
  within one layer of the --tp 1 run's: the ranks' slices replace the checkpoint, never add to it
  (the pre-streaming load held both, one more copy of every layer).
"""
import json
import re

import numpy as np
import pytest

from conftest import run_ls

GIB = 1024 ** 3


def a256(n):
    return (n + 255) // 256 * 256


def qwen35_397b_per_gpu(tp=2, mtp=False):
    H, L, V = 4096, 60, 248320
    nh, nkv, hd = 32, 2, 256
    nk, nv, dk, dv, conv = 16, 64, 128, 128, 4
    E, I, Is = 512, 1024, 1024
    bf = 2
    b = a256(V * H * bf) * 2 + a256(H * 4)  # embedding, lm_head (untied), final norm (fp32)
    if mtp:  # the MTP head (model_opts.mtp): mtp.fc [H, 2H] BF16 whole, three fp32 norms, then a full-attention layer
        b += a256(H * 2 * H * bf) + 3 * a256(H * 4)
    for l in range(L + (1 if mtp else 0)):
        b += 2 * a256(H * 4)  # input / post-attention norms
        if (l + 1) % 4 == 0 or l == L:  # full attention (gated q_proj split into q and gate)
            b += 2 * a256(nh // tp * hd * H * bf)  # q, gate
            b += 2 * a256(nkv // tp * hd * H * bf)  # k, v
            b += a256(H * nh // tp * hd * bf)  # o
            b += 2 * a256(hd * 4)  # q_norm, k_norm
        else:  # Gated DeltaNet
            cd = (2 * nk * dk + nv * dv) // tp
            b += a256(cd * H * bf) + a256(nv // tp * dv * H * bf) + 2 * a256(nv // tp * H * bf)
            b += a256(H * nv // tp * dv * bf)  # out_proj
            b += a256(cd * conv * 4) + 2 * a256(nv // tp * 4) + a256(dv * 4)  # conv1d, A_log, dt_bias, norm
        b += a256(E * H * bf)  # router
        i = I // tp  # NVFP4 experts: codes [N, K/2] + E4M3 scales [N, K/16]
        per_expert = 2 * (a256(i * H // 2) + a256(i * H // 16)) + a256(H * i // 2) + a256(H * i // 16)
        b += E * per_expert
        s = Is // tp
        b += 2 * a256(s * H * bf) + a256(H * s * bf) + a256(H * bf)  # shared expert + its gate
    return b


def dry(*flags):
    return run_ls("serve", "--dry-run", *flags)


def test_dry_run_397b_weights_per_gpu_match_count():
    p = dry("--model-path", "synth:qwen3.5-397b-a17b", "--tp", "2", "--max-running-requests", "16")
    assert p.returncode == 0, p.stderr[-2000:]
    m = re.search(r"weights per GPU: ([0-9.]+) GiB", p.stdout)
    assert m, p.stdout
    want = qwen35_397b_per_gpu(2) / GIB
    assert abs(float(m.group(1)) - want) < 0.01, (m.group(1), want)
    assert "60 layers, 237.0 GB of tensors" in p.stdout
    assert "verdict: fits" in p.stdout
    one = dry("--model-path", "synth:qwen3.5-397b-a17b", "--tp", "1")
    assert one.returncode == 1 and "DOES NOT FIT" in one.stdout, one.stdout
    # with MTP drafts the head loads too: one more full-attention MoE layer and mtp.fc, and a KV layer more
    k0 = float(re.search(r"KV cache: ([0-9.]+) KiB a token", p.stdout).group(1))
    h = dry("--model-path", "synth:qwen3.5-397b-a17b", "--tp", "2", "--max-running-requests", "16",
            "--speculative-algorithm", "mtp")
    assert h.returncode == 0, h.stdout + h.stderr[-2000:]
    got = float(re.search(r"weights per GPU: ([0-9.]+) GiB", h.stdout).group(1))
    want = qwen35_397b_per_gpu(2, mtp=True) / GIB
    assert abs(got - want) < 0.01, (got, want)
    k1 = float(re.search(r"KV cache: ([0-9.]+) KiB a token", h.stdout).group(1))
    assert abs(k1 / k0 - 16 / 15) < 1e-3, (k0, k1)  # 15 full-attention layers, then the head's


@pytest.mark.parametrize("model,tp,lo,hi", [("synth:qwen3.5-35b-a3b", 1, 256, 256),
                                             ("synth:qwen3.5-122b-a10b", 1, 65, 255),
                                             ("synth:qwen3.5-397b-a17b", 2, 8, 63),
                                             ("synth:qwen3-30b-a3b", 1, 256, 256)])
def test_dry_run_auto_running_requests_fit_a_quarter_of_the_caches(model, tp, lo, hi):
    """--max-running-requests left at auto on a GPU: as many as the GDN state of a quarter of the
    cache memory holds, at most 256 (models without GDN layers: 256); the plan still fits."""
    p = dry("--model-path", model, "--tp", str(tp))
    assert p.returncode == 0 and "verdict: fits" in p.stdout, p.stdout + p.stderr[-2000:]
    caches = float(re.search(r"([0-9.]+) GiB for the caches", p.stdout).group(1))
    m = re.search(r"GDN state: ([0-9.]+) MiB a slot; (\d+) running requests \(--max-running-requests auto\): "
                  r"([0-9.]+) GiB", p.stdout)
    assert m, p.stdout
    slot_mib, n, state_gib = float(m.group(1)), int(m.group(2)), float(m.group(3))
    assert lo <= n <= hi, p.stdout
    assert state_gib <= 0.25 * caches + 0.01, p.stdout
    if n < 256:  # one more would pass the quarter
        assert (n + 1) * slot_mib / 1024 > 0.25 * caches - 0.02, p.stdout
    q = dry("--model-path", model, "--tp", str(tp), "--max-running-requests", "7")
    assert "; 7 running requests:" in q.stdout, q.stdout


def test_dry_run_bad_path_exits_2():
    p = dry("--model-path", "synth:no-such-preset")
    assert p.returncode == 2 and "no-such-preset" in p.stderr, p.stderr


def peak_gb(stderr):
    m = re.search(r"host memory peak so far ([0-9.]+) GB", stderr)
    assert m, stderr[-2000:]
    return float(m.group(1))


def test_streamed_tp2_equals_tp1_and_peak_stays_within_a_layer(monkeypatch):
    monkeypatch.setenv("LASTSTAND_LOG_LOAD", "1")  # model_open logs its VmHWM however fast it loads
    model = "synth:qwen3.5-35b-a3b,layers=2"
    out = {}
    for tp in (1, 2):
        p = run_ls("logits", "--model-path", model, "--ids", "1,2,3", "--device", "cpu", "--tp", str(tp))
        assert p.returncode == 0, p.stderr[-2000:]
        out[tp] = (np.array(json.loads(p.stdout)["logits"], dtype=np.float64), peak_gb(p.stderr))
    a, b = out[1][0], out[2][0]
    assert (np.abs(a - b).max(axis=1) / np.abs(a).max(axis=1)).max() < 1e-5
    assert (a.argmax(1) == b.argmax(1)).all()
    # one 35B layer is 0.53 GB: streamed, --tp 2 peaks at most a layer (+ slack) above --tp 1
    assert out[2][1] < out[1][1] + 0.53 + 0.3, (out[1][1], out[2][1])


@pytest.mark.parametrize("model,tp", [("qwen3_5_moe_text", 1), ("qwen3_5_moe_text", 2), ("qwen3_next", 1),
                                      ("qwen3_next", 2), ("qwen3_moe", 2), ("qwen3_5_moe_text-nvfp4", 1)])
def test_device_load_path_on_the_cpu_matches_transformers(shared_dir, monkeypatch, model, tp):
    """LASTSTAND_TEST_CPU_UPLOAD=1 runs the GPU load path on the CPU (each part copied to "device"
    memory and repointed, the host copies freed, the ranks' row slices as views and column slices
    through the staging, mapped pages released) with glibc poisoning freed memory: a weight read
    after its host copy was freed, or never repointed, shows in the logits against transformers."""
    import os
    d = os.path.join(shared_dir, "fixtures", "models", model)
    r = json.load(open(os.path.join(d, "ref.json")))
    monkeypatch.setenv("LASTSTAND_TEST_CPU_UPLOAD", "1")
    monkeypatch.setenv("MALLOC_PERTURB_", "165")
    p = run_ls("logits", "--model-path", d, "--ids", ",".join(map(str, r["input_ids"])), "--device", "cpu",
               "--tp", str(tp))
    assert p.returncode == 0, p.stderr[-2000:]
    placed = [int(b) for b in re.findall(r"GiB of weights \((\d+) bytes\)", p.stderr)]
    assert len(placed) == tp and min(placed) > 0, p.stderr[-2000:]  # the upload path ran on every rank
    a = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    hf = np.array(r["logits"], dtype=np.float64)
    assert (np.abs(a - hf).max(axis=1) / np.abs(hf).max(axis=1)).max() < 1e-4
    assert (a.argmax(1) == hf.argmax(1)).all()
