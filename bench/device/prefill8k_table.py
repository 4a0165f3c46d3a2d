#!/usr/bin/env python3
"""prefill8k_table.py: where a prefill step's time goes, out of an ncu raw CSV (bench/device/prefill8k.sh).

usage: prefill8k_table.py NCU_RAW.csv TAG STEPS N_ATTN N_GDN

The CSV is `ncu --import R --csv --page raw --print-units base` of a `laststand generate` run of
synth Qwen3.5-35B-A3B cut to N_ATTN full-attention + N_GDN GDN layers (the metrics
gpu__time_duration.sum, dram__bytes_read.sum, dram__bytes_write.sum). Forward passes are split at
the embedding kernel (sm_embed*); the last len(STEPS) forwards are the prompt's prefill steps,
STEPS = their token counts in order (e.g. 2048,2048,2048,2048: an 8192-token prompt in chunks of
2048; the first chunk starts at position 0).

Each step: kernels by family (name prefixes: attention fp_/att_, gdn gc_/gdn_/gd_, moe mg_/moe_/
mv/mr_, norms and small ops sm_, sampling smp_/smw_, everything else is cuBLAS(Lt): the dense
BF16 projections, the MoE router and lm_head), each with its µs, share, the FLOPs the 35B's
shapes give it (hidden 2048; q_proj + gate 8192, k/v 512, o_proj 4096 -> 2048; GDN in_proj_qkv
8192, z 4096, b/a 32, out_proj; router 256; 8 of 256 experts + the shared expert, intermediate
512; causal attention 16 heads x 256 over the chunk's positions; GDN chunked ~180 kFLOP a token a
v head (32 heads, chunks of 64: the WY transform, Q·S, W·S, Kᵀ·V', the in-chunk products)) and
TFLOP/s; the sum scaled to 40 layers (10 attention + 30 GDN). Then, for the last step, one row
per kernel name (count, total µs, µs/call, GB/s) and the raw kernels of its first layers.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ncu_csv  # noqa: E402

H, V = 2048, 248320


def family(name):
    n = name.split("<")[0]
    for fam, pre in (("attention", ("fp_", "att_")), ("gdn", ("gc_", "gdn_", "gd_")),
                     ("moe", ("mg_", "mw_", "moe_", "mv_", "mvd_", "mvb_", "mr_")), ("small", ("sm_",)),
                     ("sampling", ("smp_", "smw_", "sample"))):
        if n.startswith(pre):
            return fam
    return "cublas"


def flops(M, p, na, ng):
    """FLOPs a family does for a chunk of M tokens starting at position p."""
    dense = (na * 2 * M * (H * (8192 + 512 + 512) + 4096 * H) + ng * 2 * M * (H * (8192 + 4096 + 64) + 4096 * H)
             + (na + ng) * 2 * M * H * 256 + 2 * H * V)
    return {"cublas": dense, "moe": (na + ng) * 2 * M * 9 * 3 * 512 * H,
            "attention": na * 4 * 256 * 16 * (M * p + M * (M + 1) / 2), "gdn": ng * M * 32 * 180e3,
            "small": 0, "sampling": 0}


def main():
    path, tag, steps = sys.argv[1], sys.argv[2], [int(v) for v in sys.argv[3].split(",")]
    na, ng = int(sys.argv[4]), int(sys.argv[5])
    try:
        ks = ncu_csv.load(path)
    except ValueError as err:
        print(f"[{tag}] {err}")
        return 1
    starts = [i for i, k in enumerate(ks) if k["name"].startswith("sm_embed")]
    fw = [ks[a:b] for a, b in zip(starts, starts[1:] + [len(ks)])]
    print(f"[{tag}] {len(ks)} kernels, {len(fw)} forward passes (split at sm_embed); sizes {[len(f) for f in fw]}")
    if len(fw) < len(steps):
        print(f"[{tag}] fewer forwards than the {len(steps)} prefill steps named")
        return 1
    scale = 40 / (na + ng)
    pos = 0
    tot40 = 0.0
    for si, (M, f) in enumerate(zip(steps, fw[-len(steps):])):
        tot = sum(k["us"] for k in f)
        fl = flops(M, pos, na, ng)
        print(f"[{tag}] step {si}: {M} tokens at positions {pos}..{pos + M - 1}: {len(f)} kernels, {tot:.0f} us "
              f"of kernel time ({na} attention + {ng} GDN layers); x{scale:g} -> {tot * scale / 1e3:.2f} ms for 40 layers")
        print(f"    {'family':10s} {'n':>4s} {'us':>9s} {'%':>6s} {'GFLOP':>8s} {'TFLOP/s':>8s} {'GB/s':>6s}")
        agg = {}
        for k in f:
            a = agg.setdefault(family(k["name"]), [0, 0.0, 0.0])
            a[0] += 1
            a[1] += k["us"]
            a[2] += k["mb"]
        for fam, (n, us, mb) in sorted(agg.items(), key=lambda x: -x[1][1]):
            g = fl.get(fam, 0) / 1e9
            print(f"    {fam:10s} {n:4d} {us:9.1f} {100 * us / tot:6.1f} {g:8.1f} "
                  f"{g * 1e9 / (us * 1e-6) / 1e12 if us > 0 else 0:8.1f} {mb * 1e6 / (us * 1e-6) / 1e9 if us > 0 else 0:6.0f}")
        tot40 += tot * scale
        pos += M
    print(f"[{tag}] all {len(steps)} steps: {tot40 / 1e3:.2f} ms of kernel time scaled to 40 layers "
          f"(serialized by ncu: no overlap, no launch gaps)")
    step = fw[-1]
    tot = sum(k["us"] for k in step)
    agg = {}
    for k in step:
        a = agg.setdefault(k["name"], [0, 0.0, 0.0])
        a[0] += 1
        a[1] += k["us"]
        a[2] += k["mb"]
    print(f"[{tag}] the last step per kernel name, by total time:")
    print(f"{'kernel':70s} {'n':>4s} {'total us':>9s} {'%':>6s} {'us/call':>8s} {'GB/s':>6s}")
    for name, (n, us, mb) in sorted(agg.items(), key=lambda x: -x[1][1]):
        print(f"{name[:70]:70s} {n:4d} {us:9.1f} {100 * us / tot:6.1f} {us / n:8.1f} "
              f"{mb * 1e6 / (us * 1e-6) / 1e9 if us > 0 else 0:6.0f}")
    print(f"[{tag}] the last step's kernels in launch order (first 120):")
    for i, k in enumerate(step[:120]):
        print(f"{i:4d} {k['name'][:80]:80s} {k['grid'][:16]:>16s} {k['block'][:12]:>12s} {k['us']:8.1f} {k['mb']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
