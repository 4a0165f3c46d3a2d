#!/usr/bin/env python3
"""bench/spec_bench.py URL [--reps 3] [--out-len 256] [--in-len 1024] [--conc 1]

Speculative decoding's speed on a running `laststand serve --speculative-algorithm ngram`, started
with LASTSTAND_TEST_FORCE_IDS=1 (a random-weight synth model never repeats itself, so the output is
forced to a chosen token sequence: the forward passes, drafts, verification and rollbacks are all
real, only the choice of each token is dictated). Three outputs, each --out-len tokens after a
prompt of --in-len random ids:

  none    fresh random ids: no n-gram ever matches, every step is a plain decode step (CUDA graphs,
          device sampling): the same server without drafts, measured in the same run;
  copy    a stretch of the prompt copied verbatim (an edit, an extraction, a quote): drafts accepted
          nearly always;
  quarter the copy with every 4th token replaced: drafts accepted in part.

For each: the median over --reps streamed /v1/completions of the decode time per token (first chunk
to last, over tokens - 1), tokens/s, and from /metrics the verify rows, drafts and accepted drafts
the runs added. The last line is the headline: copy's decode speed over none's (the peer here is the
same server without drafts, since no other server runs on the machine), and the tokens a verify step
committed on average against its ideal 1 + k (the physical bound of one verify step per k + 1
tokens).
"""
import argparse
import json
import random
import statistics
import time
import urllib.request


def metrics(base):
    out = {}
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("laststand:spec_") and "{" in line:
                out[line[len("laststand:"):line.index("{")]] = float(line.rsplit(" ", 1)[1])
    return out


def model_id(base):
    with urllib.request.urlopen(base + "/v1/models", timeout=60) as r:
        return json.loads(r.read())["data"][0]["id"]


def one(base, model, prompt, force, conc_id):
    body = {"model": model, "prompt": prompt, "max_tokens": len(force), "temperature": 0, "ignore_eos": True,
            "force_ids": force, "stream": True, "logprobs": 0, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    t_first = t_last = None
    n = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            now = time.time()
            if ev.get("choices"):
                t_first = t_first or now
                t_last = now
            if ev.get("usage"):
                n = ev["usage"]["completion_tokens"]
    assert n == len(force), f"request {conc_id}: {n} tokens, wanted {len(force)}"
    return (t_last - t_first) / max(1, n - 1), t_first - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--in-len", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=150000)
    ap.add_argument("--k", type=int, default=4, help="the server's draft tokens (num-draft-tokens - 1)")
    a = ap.parse_args()
    base = a.url.rstrip("/")
    model = model_id(base)
    rnd = random.Random(7)
    rows = []
    for name in ("none", "copy", "quarter"):
        tpots, ttfts = [], []
        m0 = metrics(base)
        for rep in range(a.reps):
            prompt = [rnd.randrange(1000, a.vocab) for _ in range(a.in_len)]
            if name == "none":
                force = [rnd.randrange(1000, a.vocab) for _ in range(a.out_len)]
            else:
                s = rnd.randrange(0, a.in_len - a.out_len)
                force = prompt[s:s + a.out_len]
                if name == "quarter":
                    force = [rnd.randrange(1000, a.vocab) if i % 4 == 3 else t for i, t in enumerate(force)]
            tpot, ttft = one(base, model, prompt, force, rep)
            tpots.append(tpot)
            ttfts.append(ttft)
        m1 = metrics(base)
        d = {k: m1.get(k, 0) - m0.get(k, 0) for k in ("spec_verify_rows_total", "spec_draft_tokens_total",
                                                        "spec_accepted_tokens_total")}
        rows.append((name, statistics.median(tpots), statistics.median(ttfts), d))
    base_tpot = rows[0][1]
    print(f"{'output':8} {'TPOT ms':>8} {'tok/s':>8} {'x none':>7} {'TTFT ms':>8} {'verify rows':>11} "
          f"{'drafts':>7} {'accepted':>8} {'tok/verify':>10}")
    for name, tpot, ttft, d in rows:
        rv = d["spec_verify_rows_total"]
        per = 1 + d["spec_accepted_tokens_total"] / rv if rv else 0
        print(f"{name:8} {tpot * 1e3:8.3f} {1 / tpot:8.1f} {base_tpot / tpot:7.2f} {ttft * 1e3:8.1f} {rv:11.0f} "
              f"{d['spec_draft_tokens_total']:7.0f} {d['spec_accepted_tokens_total']:8.0f} {per:10.2f}")
    name, tpot, _, d = rows[1]
    rv = d["spec_verify_rows_total"]
    per = 1 + d["spec_accepted_tokens_total"] / rv if rv else 0
    print(f"headline: copy decode {1 / tpot:.1f} tok/s = {base_tpot / tpot:.2f}x the same server without drafts; "
          f"{per:.2f} tokens per verify step = {per / (1 + a.k):.2f} of the ideal {1 + a.k}")


if __name__ == "__main__":
    main()
