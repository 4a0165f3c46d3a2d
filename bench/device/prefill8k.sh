#!/usr/bin/env bash
# device-limit: 200
# bench/device/prefill8k.sh: time to first token of long prompts on synth Qwen3.5-35B-A3B (40
# layers, random weights, NVFP4 experts) on one GPU and where a prefill step's time goes; for the
# integrator's device rounds (notes: DEVICE_ROUNDS.md). Round R1 (bench/RESULTS.md "Prefill: TTFT
# at 1k-8k tokens (S9)") also timed the PyTorch peer (PEER=1 runs it again).
#
#   bash bench/device/prefill8k.sh BIN OUTDIR
#
# 1. TTFT as a client sees it: `serve synth:qwen3.5-35b-a3b` (the plans serve picks on auto,
#    named: no doctor; --prefix-cache off; context 16384) + `BIN bench` at concurrency 1, prompts of
#    1024, 4096 and 8192 random token ids, 1 output token, 3 each after a warm-up; once per entry
#    of CHUNKS (default "8192 2048": the default chunk, and the old one): the
#    --chunked-prefill-size, then switches: y LASTSTAND_GDN_WY=1 (the chunk-parallel GDN form
#    forced), m LASTSTAND_MG_WGMMA=0 (the old MoE GEMMs), o LASTSTAND_FP_LPT=0 (flash prefill's
#    ascending tile order). Then what the chunk size costs decode: a stream decoding 500 tokens
#    while two 8192-token prompts arrive; its inter-token latency median / p99 / max.
# 2. tests/test_gpu_gdn_wy.py and tests/test_gpu_moe_wgmma.py (this session's kernels against the
#    doctor's fp64 oracle, the GDN forms' greedy ids, the wgmma logits against the CPU's).
# 3. ncu (--clock-control none --cache-control none) over `BIN generate` of the 35B cut to 4
#    layers (1 full-attention + 3 GDN: the 40-layer model's 1:3 mix), an 8192-token prompt (one
#    step at the default chunk), 1 new token, eager, the defaults. prefill8k_table.py prints the
#    step's time by family (cuBLAS, moe, attention, gdn, small ops) with FLOPs and TFLOP/s, scaled
#    to 40 layers, and its kernels by name and in launch order.
# Earlier rounds also ran (see git history): the PyTorch peer (PEER=1 still runs it), ncu sections,
# the MoE variants' doctor times.
# Each part is bounded by `timeout`; the whole script stays under 200 s.
. "$(dirname "$0")/lib.sh"
dev_init prefill8k 195 "$@"
export NCCL_NVLS_ENABLE=0
PLANS=("${DEV_PLANS_PREFILL[@]}")
CHUNKS=${CHUNKS:-8192 2048}

PORT=$((34000 + $$ % 2000))
for cfg in $CHUNKS; do
    chunk=${cfg%%[a-z]*}
    venv=()
    case $cfg in *y*) venv+=(LASTSTAND_GDN_WY=1) ;; esac
    case $cfg in *m*) venv+=(LASTSTAND_MG_WGMMA=0) ;; esac
    case $cfg in *o*) venv+=(LASTSTAND_FP_LPT=0) ;; esac
    [ "$(left)" -gt 70 ] || { echo "== ttft $cfg: skipped (time)"; continue; }
    echo "== ttft: serve synth 35B (40 layers), --chunked-prefill-size $chunk, ${venv[*]:-defaults}, prefix cache off; c = 1, 1 output token $(el)"
    env "${venv[@]}" "$BIN" serve --model-path synth:qwen3.5-35b-a3b --host 127.0.0.1 --port $PORT --device cuda "${PLANS[@]}" \
        --trust-backend --prefix-cache off --max-running-requests 4 --context-length 16384 \
        --chunked-prefill-size "$chunk" >"$OUT/serve-$cfg.log" 2>&1 &
    spid=$!
    t1=$(date +%s)
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ]; do
        if ! kill -0 $spid 2>/dev/null || [ $(( $(date +%s) - t1 )) -gt 40 ]; then
            echo "server not healthy after $(( $(date +%s) - t1 )) s"; tail -5 "$OUT/serve-$cfg.log"; break
        fi
        sleep 0.5
    done
    echo "healthy after $(( $(date +%s) - t1 )) s"
    for len in 1024 4096 8192; do
        timeout -k 3 30 "$BIN" bench --base-url "http://127.0.0.1:$PORT" --backend openai --num-prompts 3 \
            --random-input-len $len --random-output-len 1 --random-range-ratio 1.0 --max-concurrency 1 \
            --warmup-requests 1 --extra-request-body '{"logprobs":0}' --output-file "$OUT/bench-$cfg-$len.jsonl" \
            >"$OUT/bench-$cfg-$len.txt" 2>&1
        rc=$?
        python3 - "$OUT/bench-$cfg-$len.jsonl" $cfg $len $rc <<'PY'
import json, sys
p, chunk, n, rc = sys.argv[1:5]
try:
    r = json.loads(open(p).read().splitlines()[-1])
    med, mean, mx = r["median_ttft_ms"], r["mean_ttft_ms"], r["max_ttft_ms"]
    print(f"  chunk {chunk:>5s}  prompt {n:>5s}  TTFT median {med:8.1f} ms  mean {mean:8.1f}  max {mx:8.1f}  "
          f"({int(n) / (med / 1e3):7.0f} prompt tok/s)  ok {r['completed']}/{r['completed'] + r['failed']}")
except Exception as err:
    print(f"  chunk {chunk} prompt {n}: bench rc {rc}, no result ({err})")
PY
        [ $rc = 0 ] || tail -3 "$OUT/bench-$cfg-$len.txt"
    done
    # what a prefill step costs the decode rows beside it: one stream decoding (300 in, 500 out)
    # while two 8192-token prompts arrive; its inter-token latencies (median, p99, max)
    B=("$BIN" bench --base-url "http://127.0.0.1:$PORT" --backend openai --random-range-ratio 1.0 --max-concurrency 1
       --warmup-requests 0 --extra-request-body '{"logprobs":0}')
    timeout -k 3 20 "${B[@]}" --num-prompts 1 --random-input-len 300 --random-output-len 500 \
        --output-file "$OUT/mix-$cfg-dec.jsonl" >"$OUT/mix-$cfg-dec.txt" 2>&1 &
    bpid=$!
    sleep 0.4
    timeout -k 3 20 "${B[@]}" --num-prompts 2 --random-input-len 8192 --random-output-len 1 \
        --output-file "$OUT/mix-$cfg-pre.jsonl" >"$OUT/mix-$cfg-pre.txt" 2>&1
    wait $bpid
    python3 - "$OUT/mix-$cfg-dec.jsonl" "$OUT/mix-$cfg-pre.jsonl" $cfg <<'PY'
import json, sys
try:
    d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
    p = json.loads(open(sys.argv[2]).read().splitlines()[-1])
    print(f"  chunk {sys.argv[3]:>5s}  decode beside two 8k prefills: ITL median {d['median_itl_ms']:.2f} ms, "
          f"p99 {d['p99_itl_ms']:.1f}, max {d['max_itl_ms']:.1f} ms (TPOT {d['median_tpot_ms']:.2f}); "
          f"the 8k prompts' TTFT median {p['median_ttft_ms']:.1f} ms")
except Exception as err:
    print(f"  chunk {sys.argv[3]}: mixed run gave no result ({err})")
PY
    kill -TERM $spid 2>/dev/null
    for _ in $(seq 50); do kill -0 $spid 2>/dev/null || break; sleep 0.2; done
    kill -KILL $spid 2>/dev/null
    wait $spid 2>/dev/null
    grep -E "budget|wgmma|ERROR|error" "$OUT/serve-$cfg.log" | cut -c1-220 | head -3
done


if [ "$(left)" -gt 60 ] && python3 -c "import pytest" 2>/dev/null; then
    echo "== pytest tests/test_gpu_gdn_wy.py $(el)"
    BUILD=$D LS_SHARED=$D timeout -k 3 50 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_gdn_wy.py 2>&1 |
        grep -vE "^\s*$" | tail -12
    echo "rc=$? $(el)"
fi

if [ "${PEER:-0}" = 1 ]; then
    echo "== peer: PyTorch BF16 (cuBLAS) and SDPA on the 35B's prefill shapes $(el)"
    timeout -k 3 45 python3 bench/device/prefill8k_peer.py 2048,8192 2>&1 | tail -n 40
    echo "rc=$? $(el)"
fi

if [ -n "$NCU" ] && [ "$(left)" -gt 30 ]; then
    lim=$(( $(left) - 8 ))
    [ $lim -gt 50 ] && lim=50
    echo "== ncu: generate synth 35B cut to 4 layers, 8192-token prompt (one step), 1 new token, eager, defaults (limit $lim s) $(el)"
    timeout -k 3 $lim "$NCU" --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu-p8k" \
        "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=4" --ids "$(ids 8192)" --max-new-tokens 1 \
        --device cuda --disable-cuda-graph --prefix-cache off "${PLANS[@]}" >"$OUT/ncu-p8k.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|error:" "$OUT/ncu-p8k.out" | head -5
    if [ -f "$OUT/ncu-p8k.ncu-rep" ]; then
        timeout 20 "$NCU" --import "$OUT/ncu-p8k.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-p8k.csv" 2>"$OUT/ncu-p8k.csv.err"
        timeout 20 python3 bench/device/prefill8k_table.py "$OUT/ncu-p8k.csv" p8k 8192 1 3 ||
            head -c 400 "$OUT/ncu-p8k.csv.err"
    fi
fi

if [ "$(left)" -gt 30 ] && python3 -c "import pytest" 2>/dev/null; then
    echo "== pytest tests/test_gpu_moe_wgmma.py $(el)"
    BUILD=$D LS_SHARED=$D timeout -k 3 $(( $(left) - 12 )) python3 -m pytest -q -p no:cacheprovider -rfE \
        tests/test_gpu_moe_wgmma.py 2>&1 | grep -vE "^\s*$" | tail -12
    echo "rc=$? $(el)"
fi

echo "total $(( $(date +%s) - T0 )) s"
