"""bench/device/gmask_tpot.py BIN DEMO_MODEL [MODEL] [MODES]: decode time per token (TPOT) of
constrained requests against unconstrained ones on the GPU engine, constrained rows sampled on
the host (LASTSTAND_GRAMMAR_DEVICE=0, the S8 path: the step's logits come back) or by the device
sampler (=1, S9). One server per mode (MODES: comma list of 1 / 0, default "1,0"), each:
  c1: one request at a time, 128 streamed tokens: unconstrained, json_schema (a free string,
      ~all ids allowed a step), json_object, logit_bias (3 ids);
  c16: 16 concurrent unconstrained requests, then 1 json_schema + 15 unconstrained (the
      unconstrained rows must not pay for the constrained one), then 16 json_schema.
TPOT = (last chunk - first chunk) / (tokens - 1) per request, the mean over a group. Prints
GMASK_TPOT lines and the /metrics counts of device- and host-sampled constrained rows."""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from e2e_util import Server, chat_tpot  # noqa: E402

BIN, DEMO = sys.argv[1], sys.argv[2]
MODEL = sys.argv[3] if len(sys.argv) > 3 else "synth:qwen3.5-35b-a3b,layers=8"
MODES = (sys.argv[4] if len(sys.argv) > 4 else "1,0").split(",")
N = 128
FREE = {"type": "json_schema", "json_schema": {"name": "t", "schema": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
KINDS = {
    "unconstrained": {},
    "json_schema": {"response_format": FREE},
    "json_object": {"response_format": {"type": "json_object"}},
    "logit_bias": {"logit_bias": {"300": 1, "17": -2, "9000": 0.5}},
}


def tpot(srv, kw, seed=1):
    return chat_tpot(srv, N, seed=seed, timeout=120, **kw)


def group(srv, kws):
    out = [None] * len(kws)

    def run(i):
        try:
            out[i] = tpot(srv, kws[i], seed=10 + i)
        except Exception as e:  # noqa: BLE001 (printed)
            out[i] = (float("nan"), repr(e))
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(kws))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def ms(xs):
    xs = [x for x, _ in xs]
    return 1e3 * sum(xs) / len(xs)


for mode in MODES:
    t0 = time.time()
    with Server(BIN, MODEL, "--tokenizer-path", DEMO, "--device", "cuda", "--max-running-requests", "16",
                env={"LASTSTAND_GRAMMAR_DEVICE": mode}, timeout=240) as srv:
        tag = f"{MODEL} constrained rows on the {'device' if mode == '1' else 'host'}"
        print(f"== {tag} (server up in {time.time() - t0:.0f} s)", flush=True)
        tpot(srv, {})  # warm-up: the graphs, the trie of the vocabulary
        tpot(srv, KINDS["json_schema"])
        c1 = {k: tpot(srv, kw) for k, kw in KINDS.items()}
        line = ", ".join(f"{k} {1e3 * v[0]:.3f} ms ({v[1]} tok)" for k, v in c1.items())
        print(f"GMASK_TPOT c1 [{tag}]: {line}", flush=True)
        free16 = group(srv, [{}] * 16)
        mixed = group(srv, [KINDS["json_schema"]] + [{}] * 15)
        cons16 = group(srv, [KINDS["json_schema"]] * 16)
        print(f"GMASK_TPOT c16 [{tag}]: 16 unconstrained {ms(free16):.3f} ms; 1 json_schema + 15 unconstrained: "
              f"the json_schema {ms(mixed[:1]):.3f} ms, the unconstrained {ms(mixed[1:]):.3f} ms; 16 json_schema "
              f"{ms(cons16):.3f} ms", flush=True)
        bad = [x for x in free16 + mixed + cons16 if x[1] != N]
        if bad:
            print(f"GMASK_TPOT errors: {bad[:3]}")
        print(f"GMASK_ROWS [{tag}]: device {srv.metric('constrained_rows_device_total', -1)} host "
              f"{srv.metric('constrained_rows_host_total', -1)} ({time.time() - t0:.0f} s)", flush=True)
    # the engine's closing lines: mean decode step, the constrained rows' host-side staging cost
    for ln in srv.log_text().splitlines():
        if "decode steps of" in ln or "constrained rows sampled" in ln or "CUDA graphs:" in ln:
            print(f"GMASK_LOG [{tag}]: {ln.split('] ', 1)[-1]}", flush=True)
