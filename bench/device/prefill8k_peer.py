#!/usr/bin/env python3
"""prefill8k_peer.py: the peer of a 35B prefill step's kernels: PyTorch (cuBLAS, FlashAttention)
on the same GPU, the same shapes (bench/device/prefill8k.sh).

usage: prefill8k_peer.py M[,M..]

For each M (tokens in the step) the GEMMs of synth Qwen3.5-35B-A3B's layers (hidden 2048; BF16
attention / GDN projections; MoE 256 experts top-8, intermediate 512, shared expert 512), timed
with CUDA events (median of 20 after 3 warm-ups), in µs and TFLOP/s:
  attn q_proj (q + gate) [M,2048]x[2048,8192]; k_proj / v_proj [.,512]; o_proj [M,4096]x[4096,2048]
  gdn in_proj_qkv [8192], in_proj_z [4096], out_proj; router [256]
  shared expert gate+up [M,2048]x[2048,1024], down [M,512]x[512,2048]
  routed experts as a batched GEMM (torch.bmm) with M*8/256 rows per expert, gate+up and down
    (the grouped GEMM's uniform-routing equivalent, BF16 weights: what an NVFP4 -> BF16 dequant
    + cuBLAS path would run, without the dequant)
  causal attention (SDPA, 16 q heads, head_dim 256, K/V expanded from 2 heads) over M tokens
and the dense peak: [8192,8192]x[8192,8192]. Prints one line a shape.
"""
import sys

import torch


def timeit(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def line(name, us, flop):
    print(f"  {name:44s} {us:9.1f} us {flop / 1e9:9.1f} GFLOP {flop / (us * 1e-6) / 1e12:7.1f} TFLOP/s", flush=True)


def main():
    ms = [int(v) for v in sys.argv[1].split(",")]
    dev = torch.device("cuda")
    bf = torch.bfloat16
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, cuBLAS BF16, fp32 accumulate")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=bf)
    b = torch.randn(n, n, device=dev, dtype=bf)
    line("dense peak [8192,8192]x[8192,8192]", timeit(lambda: a @ b), 2.0 * n * n * n)
    del a, b
    for M in ms:
        print(f"M = {M}")
        tot_us = tot_f = 0.0
        for name, K, N, per40 in (("attn q_proj+gate", 2048, 8192, 10), ("attn k_proj", 2048, 512, 10),
                                  ("attn v_proj", 2048, 512, 10), ("attn o_proj", 4096, 2048, 10),
                                  ("gdn in_proj_qkv", 2048, 8192, 30), ("gdn in_proj_z", 2048, 4096, 30),
                                  ("gdn in_proj_b", 2048, 32, 30), ("gdn in_proj_a", 2048, 32, 30),
                                  ("gdn out_proj", 4096, 2048, 30), ("moe router", 2048, 256, 40),
                                  ("shared expert gate+up", 2048, 1024, 40), ("shared expert down", 512, 2048, 40)):
            x = torch.randn(M, K, device=dev, dtype=bf)
            w = torch.randn(N, K, device=dev, dtype=bf)
            us = timeit(lambda: x @ w.t())
            line(f"{name} [{M},{K}]x[{K},{N}]", us, 2.0 * M * K * N)
            tot_us += per40 * us
            tot_f += per40 * 2.0 * M * K * N
        E, k, I, H = 256, 8, 512, 2048
        r = max(1, M * k // E)
        x = torch.randn(E, r, H, device=dev, dtype=bf)
        wgu = torch.randn(E, H, 2 * I, device=dev, dtype=bf)
        us = timeit(lambda: torch.bmm(x, wgu))
        line(f"experts gate+up bmm {E}x[{r},{H}]x[{H},{2 * I}]", us, 2.0 * E * r * H * 2 * I)
        tot_us += 40 * us
        tot_f += 40 * 2.0 * E * r * H * 2 * I
        h = torch.randn(E, r, I, device=dev, dtype=bf)
        wd = torch.randn(E, I, H, device=dev, dtype=bf)
        us = timeit(lambda: torch.bmm(h, wd))
        line(f"experts down bmm {E}x[{r},{I}]x[{I},{H}]", us, 2.0 * E * r * I * H)
        tot_us += 40 * us
        tot_f += 40 * 2.0 * E * r * I * H
        del x, wgu, h, wd
        q = torch.randn(1, 16, M, 256, device=dev, dtype=bf)
        kv = torch.randn(1, 2, M, 256, device=dev, dtype=bf)
        kk, vv = kv.repeat_interleave(8, 1), kv.repeat_interleave(8, 1)
        f_att = 2.0 * 16 * 256 * M * M  # causal: half of 4·M²·d per head
        try:
            us = timeit(lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=True))
            line(f"SDPA causal 16x{M}x256 (kv expanded)", us, f_att)
            tot_us += 10 * us
            tot_f += 10 * f_att
        except Exception as err:  # noqa: BLE001 (any backend refusal is reported, not fatal)
            print(f"  SDPA causal: {str(err)[:200]}")
        print(f"  sum over 40 layers (GEMMs + attention, no GDN / norms): {tot_us / 1e3:.2f} ms, "
              f"{tot_f / 1e12:.2f} TFLOP, {tot_f / (tot_us * 1e-6) / 1e12:.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
