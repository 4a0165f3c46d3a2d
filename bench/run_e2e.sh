#!/usr/bin/env bash
# bench/run_e2e.sh: the project's end-to-end serving benchmark in one command.
#
# Starts `laststand serve --model-path synth:PRESET` (random weights with the
# real architecture's exact shapes), waits for /health, runs a concurrency
# sweep with `laststand bench` (sglang.bench_serving metrics, random dataset,
# token-id prompts of exact length, ignore_eos so output lengths hold), and
# writes into OUT_DIR:
#   bench.txt     the tables (last line: the headline)
#   bench.jsonl   one JSON object per concurrency level, every figure
#   bench.svg     output throughput and median TPOT against concurrency
#   server.log    the server's log (backend choices, doctor, errors)
#   metrics.txt   the server's /metrics after the run
#   meta.txt      date, commit, GPU, driver, the exact commands
#   SUMMARY.md    the table to paste into bench/RESULTS.md
#
# usage: bench/run_e2e.sh OUT_DIR [PRESET] [-- extra serve flags]
#   PRESET defaults to qwen3.5-35b-a3b. Environment knobs (defaults):
#   CONCURRENCY=1,8,64,256  NUM_PROMPTS=16,64,256,1024 (one count per level)
#   INPUT_LEN=1024 OUTPUT_LEN=256 RANGE_RATIO=1.0  BACKEND=openai (completions)
#   PORT=30000  HEALTH_TIMEOUT=1800  BIN=build/laststand  WARMUP=4
#   TOKENIZER=DIR (a tokenizer.json folder for the server; synth presets have
#   none). Without one the server streams no text, so bench asks for
#   logprobs (EXTRA_BODY='{"logprobs":0}'): each token's chunk then carries
#   its logprob and is timed; prompts are token ids below the model's vocab_size.
# Exit code: bench's (0 ok, 1 a level had no successful request), 1 if the
# server never became healthy (its log tail is printed).
set -euo pipefail

OUT=${1:?usage: bench/run_e2e.sh OUT_DIR [PRESET] [-- extra serve flags]}
shift
PRESET=qwen3.5-35b-a3b
if [ $# -gt 0 ] && [ "$1" != "--" ]; then PRESET=$1; shift; fi
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/build/laststand}
CONCURRENCY=${CONCURRENCY:-1,8,64,256}
NUM_PROMPTS=${NUM_PROMPTS:-16,64,256,1024}
INPUT_LEN=${INPUT_LEN:-1024}
OUTPUT_LEN=${OUTPUT_LEN:-256}
RANGE_RATIO=${RANGE_RATIO:-1.0}
BACKEND=${BACKEND:-openai}
PORT=${PORT:-30000}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-1800}
WARMUP=${WARMUP:-4}
TOKENIZER=${TOKENIZER:-}
if [ -n "$TOKENIZER" ]; then EXTRA_BODY=${EXTRA_BODY:-'{}'}; else EXTRA_BODY=${EXTRA_BODY:-'{"logprobs":0}'}; fi
URL=http://127.0.0.1:$PORT

[ -x "$BIN" ] || { echo "run_e2e: $BIN is missing: build first (make)" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if curl -s -o /dev/null "$URL/health"; then
    echo "run_e2e: something already answers on $URL; stop it or set PORT" >&2
    exit 2
fi

# the largest level decides how many requests the server must run at once
MAXC=$(echo "$CONCURRENCY" | tr ',' '\n' | sort -n | tail -1)
SERVE=("$BIN" serve --model-path "synth:$PRESET" --host 127.0.0.1 --port "$PORT"
       --max-running-requests "$MAXC")
[ -n "$TOKENIZER" ] && SERVE+=(--tokenizer-path "$TOKENIZER")
SERVE+=("${EXTRA[@]}")
BENCH=("$BIN" bench --base-url "$URL" --backend "$BACKEND" --num-prompts "$NUM_PROMPTS"
       --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" --random-range-ratio "$RANGE_RATIO"
       --max-concurrency "$CONCURRENCY" --warmup-requests "$WARMUP" --extra-request-body "$EXTRA_BODY"
       --output-file "$OUT/bench.jsonl" --plot "$OUT/bench.svg")

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "host: $(hostname)"
    if command -v nvidia-smi >/dev/null; then
        echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | paste -sd ';')"
    else
        echo "gpu: none (nvidia-smi not found)"
    fi
    echo "serve: ${SERVE[*]}"
    echo "bench: ${BENCH[*]}"
} > "$OUT/meta.txt"
cat "$OUT/meta.txt"

"${SERVE[@]}" > "$OUT/server.log" 2>&1 &
SPID=$!
stop_server() {
    if kill -0 "$SPID" 2>/dev/null; then
        kill -TERM "$SPID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$SPID" 2>/dev/null || true
    fi
    wait "$SPID" 2>/dev/null || true
}
trap stop_server EXIT

echo "run_e2e: waiting for $URL/health (up to ${HEALTH_TIMEOUT}s)" >&2
t0=$(date +%s)
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = "200" ]; do
    if ! kill -0 "$SPID" 2>/dev/null; then
        echo "run_e2e: the server exited before it was healthy; its log ends with:" >&2
        tail -20 "$OUT/server.log" >&2
        exit 1
    fi
    if [ $(( $(date +%s) - t0 )) -ge "$HEALTH_TIMEOUT" ]; then
        echo "run_e2e: no 200 from /health within ${HEALTH_TIMEOUT}s; the log ends with:" >&2
        tail -20 "$OUT/server.log" >&2
        exit 1
    fi
    sleep 1
done
echo "startup_s: $(( $(date +%s) - t0 ))" >> "$OUT/meta.txt"
echo "run_e2e: healthy after $(( $(date +%s) - t0 ))s; benchmarking" >&2

rc=0
"${BENCH[@]}" | tee "$OUT/bench.txt" || rc=$?
curl -s "$URL/metrics" > "$OUT/metrics.txt" || true

# SUMMARY.md: the block to paste into bench/RESULTS.md
python3 - "$OUT" <<'EOF' || echo "run_e2e: no python3: SUMMARY.md not written (bench.txt has the tables)" >&2
import json, sys, os
out = sys.argv[1]
meta = dict(l.rstrip("\n").split(": ", 1) for l in open(os.path.join(out, "meta.txt")) if ": " in l)
rows = [json.loads(l) for l in open(os.path.join(out, "bench.jsonl"))]
with open(os.path.join(out, "SUMMARY.md"), "w") as f:
    r0 = rows[0]
    f.write(f"### {r0['model']}: random {r0['random_input_len']} in / {r0['random_output_len']} out, "
            f"{r0['backend']}, {meta.get('date', '?')}\n\n")
    f.write(f"GPU: {meta.get('gpu', '?')}; commit {meta.get('commit', '?')}; server start-up {meta.get('startup_s', '?')} s\n\n")
    f.write(f"`{meta.get('serve', '')}`\n\n`{meta.get('bench', '')}`\n\n")
    f.write("| concurrency | prompts | ok/failed | req/s | output tok/s | total tok/s | TTFT p50 ms | TTFT p99 ms "
            "| TPOT p50 ms | TPOT p99 ms | ITL p50 ms | E2E p50 ms |\n")
    f.write("|---" * 12 + "|\n")
    for r in rows:
        f.write(f"| {r['max_concurrency']} | {r['num_prompts']} | {r['completed']}/{r['failed']} "
                f"| {r['request_throughput']:.2f} | {r['output_throughput']:.1f} | {r['total_token_throughput']:.1f} "
                f"| {r['median_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} | {r['median_tpot_ms']:.2f} "
                f"| {r['p99_tpot_ms']:.2f} | {r['median_itl_ms']:.2f} | {r['median_e2e_latency_ms']:.0f} |\n")
    best = max(rows, key=lambda r: r["output_throughput"])
    f.write(f"\nHeadline: peak output throughput {best['output_throughput']:.1f} tok/s at concurrency "
            f"{best['max_concurrency']} (median TPOT {best['median_tpot_ms']:.2f} ms); "
            f"single stream {rows[0]['output_throughput']:.1f} tok/s, "
            f"TPOT {rows[0]['median_tpot_ms']:.2f} ms at concurrency {rows[0]['max_concurrency']}.\n")
    for r in rows:
        for e in r["errors"]:
            f.write(f"\nerrors at concurrency {r['max_concurrency']}: {e['count']}x {e['error']}\n")
print(open(os.path.join(out, "SUMMARY.md")).read())
EOF
echo "run_e2e: results in $OUT" >&2
exit $rc
