#!/usr/bin/env python3
"""fp4_gemm kernel benchmark: laststand's CUDA fp4_gemm backends vs the physical
limit and vs cuBLAS BF16 (torch.matmul), measured in the same run.

1. Runs `laststand doctor --device cuda --families fp4_gemm --fp4-shapes ... --json`:
   every backend is validated (fp64 CPU oracle / cuda_ref chain of trust) and
   timed (median of CUDA-event timings over rotating buffers > 2x L2); the
   doctor also measures the device copy bandwidth (cudaMemcpy D2D of 2 GiB,
   bytes read + written).
2. Times the peer: torch.matmul(x, W.t()) with W the BF16 weight of the same
   [N, K] (what an engine without an FP4 kernel runs), same rotation and
   median method, CUDA events, and like the doctor (since 2026-11-29 15:00)
   with the timed calls queued behind a GPU-side hold so that they run back to
   back: both sides report GPU time as a CUDA graph would see it, without the
   host's launch latency.
3. Prints the table; its LAST line is the headline ratio: achieved bandwidth
   of the best M = 1 backend vs the measured copy bandwidth, and its speed vs
   the BF16 peer.

Bytes counted: NVFP4 weight (N*K/2 codes + N*K/16 scales) + x + y once; the
peer's BF16 weight is N*K*2 bytes (4x more: that is the point of W4A16).

usage: python3 bench/kernels/fp4_gemm_bench.py --laststand build/laststand
           [--shapes 4096x4096,16384x4096,1024x4096,4096x1024] [--m 1,2,4,...] [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys


def torch_peer(shapes, ms, l2_bytes=50 << 20):
    """Median GPU time of torch.matmul(x, W.t()), timed like the doctor: the calls
    queued behind a GPU-side hold (torch.cuda._sleep, spinning on the SM clock
    for ~1.5x the host's enqueue time) so they run back to back and each event
    pair measures GPU time, not Python's launch latency; redone with a longer hold
    if it ran out before the last call was enqueued."""
    import time
    import torch
    dev = torch.device("cuda")
    clock_hz = 2.0e9  # above the H200's boost clock: a hold in cycles lasts at least as long as asked
    out = {}
    for (N, K) in shapes:
        wbytes = N * K * 2
        nsets = max(2, min(64, (2 * l2_bytes + (16 << 20)) // wbytes + 1))
        w0 = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05
        ws = [w0] + [w0.clone() for _ in range(nsets - 1)]
        for M in ms:
            xs = [torch.randn(M, K, device=dev, dtype=torch.bfloat16) for _ in range(2)]
            for i in range(3):
                torch.matmul(xs[i % 2], ws[i % nsets].t())
            torch.cuda.synchronize()
            reps = 30
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            held = torch.cuda.Event()
            t0 = time.perf_counter()
            for i in range(3):
                torch.matmul(xs[i % 2], ws[(i + 1) % nsets].t())
            host = (time.perf_counter() - t0) / 3
            torch.cuda.synchronize()
            hold_s = 1.5 * reps * (host + 10e-6) + 50e-6
            for _attempt in range(2):
                torch.cuda._sleep(int(hold_s * clock_hz))
                held.record()
                for i in range(reps):
                    ev[i][0].record()
                    torch.matmul(xs[i % 2], ws[(i + 1) % nsets].t())
                    ev[i][1].record()
                covered = not held.query()
                torch.cuda.synchronize()
                if covered:
                    break
                hold_s *= 4
            t = sorted(a.elapsed_time(b) for a, b in ev)
            ms_med = t[reps // 2]
            byts = wbytes + M * K * 2 + M * N * 2
            out[(N, K, M)] = (ms_med, byts)
            del xs
        del ws, w0
        torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--laststand", default="build/laststand")
    ap.add_argument("--shapes", default="4096x4096,16384x4096,1024x4096,4096x1024")
    ap.add_argument("--m", default="1,2,4,8,16,32,64,128,256,512,1024,2048,3072,4096,8192")
    ap.add_argument("--out", default=".")
    ap.add_argument("--backends", default=None, help="restrict the doctor to these backends")
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    ms = [int(v) for v in a.m.split(",")]
    os.makedirs(a.out, exist_ok=True)
    jpath = os.path.join(a.out, "fp4_gemm_doctor.json")
    cmd = [a.laststand, "doctor", "--device", "cuda", "--shapes", "qwen3.5-397b-a17b", "--families", "fp4_gemm",
           "--fp4-shapes", a.shapes, "--m", a.m, "--json", jpath]
    if a.backends:
        cmd += ["--backends", a.backends]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(os.path.join(a.out, "fp4_gemm_doctor.txt"), "w") as f:
        f.write(r.stdout + "\n--- stderr ---\n" + r.stderr)
    if r.returncode not in (0, 1) or not os.path.exists(jpath):
        print(r.stdout, r.stderr, file=sys.stderr)
        sys.exit("doctor failed (exit %d)" % r.returncode)
    rep = json.load(open(jpath))
    copy = rep["device"].get("copy_gbs", 0.0)
    peer = torch_peer(shapes, ms)

    rows = []
    for tab in rep["tables"]:
        if tab["family"] != "fp4_gemm":
            continue
        title = tab["title"]
        dims = title.split("[")[1].split("]")[0].split(" x ")
        N, K = int(dims[0]), int(dims[1])
        for M in ms:
            best = None
            for b in tab["backends"]:
                c = tab["cells"][b].get(str(M))
                if c and c["status"] == "ok" and c.get("ms", 0) > 0 and (best is None or c["ms"] < best[1]["ms"]):
                    best = (b, c)
            pm, pb = peer[(N, K, M)]
            rows.append((N, K, M, best, pm, pb))

    print("GPU: %s (cc %s), measured copy bandwidth %.0f GB/s" % (rep["device"]["name"], rep["device"]["cc"], copy))
    hdr = "%-13s %5s  %-20s %10s %9s %6s %9s  %12s %9s %8s" % (
        "weight [NxK]", "M", "best laststand", "time", "GB/s", "%copy", "TFLOP/s", "torch bf16", "GB/s", "speedup")
    print(hdr)
    print("-" * len(hdr))
    for N, K, M, best, pm, pb in rows:
        if best:
            b, c = best
            print("%-13s %5d  %-20s %8.1fus %9.0f %5.0f%% %9.1f  %10.1fus %9.0f %7.2fx" % (
                "%dx%d" % (N, K), M, b, c["ms"] * 1e3, c["gbs"], 100 * c["gbs"] / copy if copy else 0,
                c["tflops"], pm * 1e3, pb / (pm * 1e-3) / 1e9, pm / c["ms"]))
        else:
            print("%-13s %5d  %-20s %10s %9s %6s %9s  %10.1fus" % ("%dx%d" % (N, K), M, "none correct", "-", "-", "-", "-",
                                                                 pm * 1e3))
    heads = []
    for N, K, M, best, pm, pb in rows:
        if M == 1 and best:
            b, c = best
            heads.append("[%dx%d] %s %.0f GB/s = %.0f%% of copy, %.2fx torch bf16" % (
                N, K, b, c["gbs"], 100 * c["gbs"] / copy if copy else 0, pm / c["ms"]))
    print("headline M=1: " + "; ".join(heads))


if __name__ == "__main__":
    main()
