#!/usr/bin/env python3
"""bench/mtp_bench.py URL --forces F.json [--reps 3] [--save R.json] [--baseline B.json] [--k K]

MTP drafts' speed on a running `laststand serve` of a synth model with a chain head
(`synth:PRESET,mtp=chain`: its draft after token t is always f(t)), started with
LASTSTAND_TEST_FORCE_IDS=1. A random-weight model's own tokens would never follow its random head,
so each output is forced to a chosen sequence; every forward pass, MTP head pass, draft,
verification and rollback is real, only the choice of each token is dictated. F.json (bench/device/
mtp.sh writes it with `laststand logits --mtp --chain N [--chain-deviate Q]`):
{"prompt": [ids], "outputs": {"name": [ids], ...}}, e.g.

  random    random ids: every draft rejected (what the head costs when it is always wrong);
  chain     f's chain from the prompt's last id: every draft accepted;
  chain/Q   every Q-th id random (the chain goes on from it): drafts accepted in part.

Per output: the median over --reps streamed /v1/completions of the decode time per token (first
chunk to last over tokens - 1), tokens/s and, from /metrics, the verify rows, drafts and accepted
drafts. --save writes {name: tpot}; --baseline reads one (the same bench against the server without
drafts) for the "x plain" column. The last line is the headline: the chain output's decode speed
over the server without drafts (the peer measured in the same run), and the tokens a verify step
committed against its ideal 1 + k.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spec_bench import metrics, model_id, one  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--forces", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--save")
    ap.add_argument("--baseline")
    ap.add_argument("--k", type=int, default=0, help="the server's drafts a step (num-draft-tokens - 1); 0: none")
    a = ap.parse_args()
    base = a.url.rstrip("/")
    model = model_id(base)
    spec = json.load(open(a.forces))
    prompt = spec["prompt"]
    plain = json.load(open(a.baseline)) if a.baseline else {}
    rows, saved = [], {}
    for name, force in spec["outputs"].items():
        m0 = metrics(base)
        tp = [one(base, model, prompt, force, rep)[0] for rep in range(a.reps)]
        m1 = metrics(base)
        d = {k: m1.get(k, 0) - m0.get(k, 0) for k in ("spec_verify_rows_total", "spec_draft_tokens_total",
                                                        "spec_accepted_tokens_total")}
        saved[name] = statistics.median(tp)
        rows.append((name, saved[name], d))
    if a.save:
        json.dump(saved, open(a.save, "w"))
    print(f"{'output':9} {'TPOT ms':>8} {'tok/s':>8} {'x plain':>8} {'verify rows':>11} {'drafts':>7} "
          f"{'accepted':>8} {'tok/verify':>10}")
    for name, tpot, d in rows:
        rv = d["spec_verify_rows_total"]
        per = 1 + d["spec_accepted_tokens_total"] / rv if rv else 0
        x = f"{plain[name] / tpot:8.2f}" if name in plain else f"{'-':>8}"
        print(f"{name:9} {tpot * 1e3:8.3f} {1 / tpot:8.1f} {x} {rv:11.0f} {d['spec_draft_tokens_total']:7.0f} "
              f"{d['spec_accepted_tokens_total']:8.0f} {per:10.2f}")
    name, tpot, d = next((r for r in rows if r[0] == "chain"), rows[0])
    rv = d["spec_verify_rows_total"]
    per = 1 + d["spec_accepted_tokens_total"] / rv if rv else 0
    if plain and a.k:
        print(f"headline: {name} decode {1 / tpot:.1f} tok/s = {plain[name] / tpot:.2f}x the same server without "
              f"drafts; {per:.2f} tokens per verify step = {per / (1 + a.k):.2f} of the ideal {1 + a.k}")
    else:
        print(f"headline: {name} decode {1 / tpot:.1f} tok/s (no drafts: the baseline)")


if __name__ == "__main__":
    main()
