#!/usr/bin/env python3
"""TTFT of a follow-up turn with and without the prefix cache (bench/RESULTS.md, "Prefix caching").

    python3 bench/prefix_ttft.py [--bin build/laststand] [--model synth:demo] [--vocab 4000] [-- SERVE FLAGS]

For --prefix-cache on, then off, one `laststand serve`: turn 1 = a 2000-token prompt in ids (40 new
tokens), then three follow-ups (turn 1's prompt + its output + 60 other new ids) and three misses of
the same length (another first page), each a 1-token /generate timed end to end (TTFT + one HTTP
round trip). Prints the cached_tokens and milliseconds of each, as JSON.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from e2e_util import Server  # noqa: E402


def timed(srv, ids, n):
    t0 = time.perf_counter()
    st, out = srv.post_json("/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
    assert st == 200, out
    return out["output_ids"], out["meta_info"]["cached_tokens"], time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "laststand"))
    ap.add_argument("--model", default="synth:demo")
    ap.add_argument("--vocab", type=int, default=4000, help="ids stay below this")
    ap.add_argument("serve", nargs="*", help="more serve flags (after --)")
    a = ap.parse_args()
    V = a.vocab
    res = {}
    for flag in ("on", "off"):
        with Server(a.bin, a.model, "--prefix-cache", flag, *a.serve, timeout=600) as srv:
            p1 = [(1000 + i * 7919) % V for i in range(2000)]
            o1, _, t1 = timed(srv, p1, 40)
            hit = [timed(srv, p1 + o1 + [(3000 + k * 7 + i * 611953) % V for i in range(60)], 1)[1:]
                   for k in range(3)]
            miss = [timed(srv, [(1 + k * 13 + i * 7919) % V for i in range(2100)], 1)[1:] for k in range(3)]
            res[flag] = {"turn1_s": round(t1, 3), "follow_up": [(c, round(x * 1e3, 1)) for c, x in hit],
                         "miss": [(c, round(x * 1e3, 1)) for c, x in miss],
                         "log": [ln for ln in srv.log_text().splitlines() if "prefix cache" in ln]}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
