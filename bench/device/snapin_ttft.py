#!/usr/bin/env python3
"""TTFT of prefix-cache misses and hits on a GDN model, per snapshot mode (bench/device/snapin.sh).

    python3 bench/device/snapin_ttft.py --bin BIN [--model synth:qwen3.5-35b-a3b] [--modes step,cut,off]
        [--deadline EPOCH] [--lens 1024,4096] [--device cuda] [-- SERVE FLAGS]
    (modes: step, step_r1, cut, off)

Per mode one `laststand serve --log-level debug`: step = --prefix-cache on with
LASTSTAND_PREFIX_SNAPSHOT=step (GDN snapshots inside the prefill step), step_r1 = the same with
LASTSTAND_GDN_PIECE_ROWS=0 (every gdn piece over the whole step's rows: its backend chosen for the
step's size, as in S9-R1), cut = on with
LASTSTAND_PREFIX_SNAPSHOT=cut (the prefill cut at the snapshot boundaries: the S8 way), off =
--prefix-cache off. For each prompt length L: warm-up, then 3 misses (random ids, distinct first
pages), each followed by the same prompt again (a hit up to the last page boundary before its
final 8 tokens: the snapshot the miss took inside its prefill, or at a cut) and by the prompt + 64
new ids (a hit up to L: the snapshot at the miss's last step end). Each request is a 1-token
/generate timed end to end (TTFT + one local HTTP round trip); the engine's debug lines give the
forward steps it ran and their milliseconds. Prints one line per mode and request kind (median
of 3) and a JSON line SNAPIN_TTFT with everything. Skips a mode that would not finish before
--deadline.
"""
import argparse
import json
import os
import random
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from e2e_util import Server  # noqa: E402

STEP_RE = re.compile(r"engine: step \d+: (\d+) seqs, (\d+) tokens, forward ([0-9.]+) ms")


def full_log(srv):
    srv.log.seek(0)  # the whole log (Server.log_text keeps only its tail)
    return srv.log.read()


def one(srv, ids, log_at):
    t0 = time.perf_counter()
    st, out = srv.post_json("/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": 1, "temperature": 0, "ignore_eos": True}})
    dt = time.perf_counter() - t0
    assert st == 200, out
    log = full_log(srv)
    steps = [(int(t), float(ms)) for _, t, ms in STEP_RE.findall(log[log_at:])]
    return {"ms": round(dt * 1e3, 2), "cached": out["meta_info"]["cached_tokens"],
            "steps": [t for t, _ in steps], "fwd_ms": round(sum(ms for _, ms in steps), 2)}, len(log)


def run_mode(a, mode, lens, rng):
    flags = ["--device", a.device, "--served-model-name", "m", "--log-level", "debug",
             "--prefix-cache", "off" if mode == "off" else "on", *a.serve]
    env = {"off": {}, "step": {"LASTSTAND_PREFIX_SNAPSHOT": "step"}, "cut": {"LASTSTAND_PREFIX_SNAPSHOT": "cut"},
           "step_r1": {"LASTSTAND_PREFIX_SNAPSHOT": "step", "LASTSTAND_GDN_PIECE_ROWS": "0"}}[mode]
    t0 = time.time()
    left = a.deadline - time.time()
    with Server(a.bin, a.model, *flags, env=env, timeout=max(10, left - 5)) as srv:
        start_s = round(time.time() - t0, 1)
        log_at = len(full_log(srv))
        res = {"startup_s": start_s}
        for L in lens:
            for _ in range(2):  # warm-up: the workspace and the backends at this length
                _, log_at = one(srv, [rng.randrange(a.vocab) for _ in range(L)], log_at)
            kinds = {"miss": [], "again": [], "extend": []}
            for _ in range(3):
                p = [rng.randrange(a.vocab) for _ in range(L)]
                r, log_at = one(srv, p, log_at)
                kinds["miss"].append(r)
                r, log_at = one(srv, p, log_at)
                kinds["again"].append(r)
                r, log_at = one(srv, p + [rng.randrange(a.vocab) for _ in range(64)], log_at)
                kinds["extend"].append(r)
            res[L] = kinds
        log = full_log(srv)
        res["log"] = [ln[ln.find("engine:"):][:200] for ln in log.splitlines()
                      if "prefix cache" in ln or "GDN slots" in ln]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", default="synth:qwen3.5-35b-a3b")
    ap.add_argument("--modes", default="step,step_r1,off,cut")
    ap.add_argument("--lens", default="1024,4096")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vocab", type=int, default=200000, help="ids stay below this (the 35B: 248320)")
    ap.add_argument("--deadline", type=float, default=time.time() + 600)
    ap.add_argument("--need", type=float, default=45, help="seconds a mode needs (start-up + requests)")
    ap.add_argument("serve", nargs="*", help="more serve flags (after --)")
    a = ap.parse_args()
    lens = [int(x) for x in a.lens.split(",")]
    out = {}
    for mode in a.modes.split(","):
        if a.deadline - time.time() < a.need:
            print(f"SNAPIN {mode}: skipped ({a.deadline - time.time():.0f} s left)", flush=True)
            continue
        try:
            res = run_mode(a, mode, lens, random.Random(1234))
        except Exception as e:  # noqa: BLE001 (reported, the next mode still runs)
            print(f"SNAPIN {mode}: FAILED: {str(e)[-1500:]}", flush=True)
            continue
        out[mode] = res
        print(f"SNAPIN {mode}: start-up {res['startup_s']} s; {' | '.join(res['log'])}", flush=True)
        for L in lens:
            for kind, rs in res[L].items():
                print(f"SNAPIN {mode:4s} L={L:5d} {kind:6s}: TTFT median {statistics.median(r['ms'] for r in rs):7.2f} ms "
                      f"(forward {statistics.median(r['fwd_ms'] for r in rs):7.2f} ms), cached "
                      f"{[r['cached'] for r in rs]}, steps {rs[0]['steps']}, all {[r['ms'] for r in rs]}", flush=True)
    print("SNAPIN_TTFT " + json.dumps({m: {str(k): v for k, v in r.items()} for m, r in out.items()}))


if __name__ == "__main__":
    main()
