#!/usr/bin/env bash
# device-limit: 200
# bench/device/prefill8k.sh: time to first token of long prompts on synth Qwen3.5-35B-A3B (40
# layers, random weights, NVFP4 experts) on one GPU, where a prefill step's time goes, and the
# peer (PyTorch: cuBLAS, FlashAttention) on the same shapes; for the integrator's device rounds
# (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/prefill8k.sh BIN OUTDIR
#
# 1. TTFT as a client sees it: `serve synth:qwen3.5-35b-a3b` (the plans serve picks on auto,
#    named: no doctor; --prefix-cache off; context 16384) + `BIN bench` at concurrency 1, prompts of
#    1024, 4096 and 8192 random token ids, 1 output token, 3 each after a warm-up; once per
#    --chunked-prefill-size in CHUNKS (default "2048 8192 8192w 8192wl": the default, the whole 8k
#    prompt in one step, that with the opt-in wgmma MoE GEMMs (suffix w: LASTSTAND_MG_WGMMA=1) and
#    also flash prefill's longest-tiles-first order (suffix l: LASTSTAND_FP_LPT=1)).
#    Then what the chunk size costs decode: a stream decoding 500 tokens while two 8192-token
#    prompts arrive; its inter-token latency median / p99 / max.
# 2. Peer: bench/device/prefill8k_peer.py at M = 2048 and 8192 (every GEMM shape of the 35B's
#    layers in BF16 through torch.matmul / torch.bmm, SDPA causal attention; the dense peak).
# 3. ncu (--clock-control none --cache-control none) over `BIN generate` of the 35B cut to 4
#    layers (1 full-attention + 3 GDN: the 40-layer model's 1:3 mix), an 8192-token prompt, 1 new
#    token, eager: 4 prefill steps of 2048 tokens. prefill8k_table.py prints each step's time by
#    family (cuBLAS, moe, attention, gdn, small ops) with FLOPs and TFLOP/s, scaled to 40 layers,
#    and the last step's kernels by name and in launch order.
# 4. The opt-in wgmma GEMMs of the grouped MoE (LASTSTAND_MG_WGMMA=1, src/ops/cuda/moe_wgmma.cu):
#    the doctor's fp64 verdicts and times at M = 1024, 2048, 8192 with and without the switch, and
#    tests/test_gpu_moe_wgmma.py (its padding and logits cases); flash prefill's longest-first
#    order (LASTSTAND_FP_LPT=1) through the doctor at M = 512, 3072.
# 5. ncu with sections (SpeedOfLight, ComputeWorkloadAnalysis, WarpStateStats, Occupancy) on the
#    first 16 launches of the grouped MoE GEMM, the GDN chunk kernel and flash prefill in a
#    2048-token prefill of the 4-layer model: prefill8k_ncu.py prints each one's pipes, issue
#    rate, occupancy and largest stall reasons.
# 6. The doctor at the 35B's shapes, M = 2048, 8192: gemm (cuda_cublaslt), moe (cuda_grouped_gemm,
#    also at tile height 32) against the fp64 CPU oracle, with their times.
# Each part is bounded by `timeout`; the whole script stays under 200 s.
. "$(dirname "$0")/lib.sh"
dev_init prefill8k 195 "$@"
export NCCL_NVLS_ENABLE=0
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode:16,cuda_chunked
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
CHUNKS=${CHUNKS:-2048 8192 8192w 8192wl}
ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%200000) for i in range(n)))" "$1"; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)

PORT=$((34000 + $$ % 2000))
for cfg in $CHUNKS; do
    chunk=${cfg%%[a-z]*}
    wg=0; lpt=0
    case $cfg in *w*) wg=1 ;; esac
    case $cfg in *l*) lpt=1 ;; esac
    [ "$(left)" -gt 70 ] || { echo "== ttft $cfg: skipped (time)"; continue; }
    echo "== ttft: serve synth 35B (40 layers), --chunked-prefill-size $chunk, LASTSTAND_MG_WGMMA=$wg LASTSTAND_FP_LPT=$lpt, prefix cache off; c = 1, 1 output token $(el)"
    LASTSTAND_MG_WGMMA=$wg LASTSTAND_FP_LPT=$lpt "$BIN" serve --model-path synth:qwen3.5-35b-a3b --host 127.0.0.1 --port $PORT --device cuda "${PLANS[@]}" \
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

echo "== peer: PyTorch BF16 (cuBLAS) and SDPA on the 35B's prefill shapes $(el)"
timeout -k 3 45 python3 bench/device/prefill8k_peer.py 2048,8192 2>&1 | tail -n 40
echo "rc=$? $(el)"

if [ -n "$NCU" ] && [ "$(left)" -gt 25 ]; then
    lim=$(( $(left) - 8 ))
    [ $lim -gt 70 ] && lim=70
    echo "== ncu: generate synth 35B cut to 4 layers, 8192-token prompt (4 steps of 2048), 1 new token, eager (limit $lim s) $(el)"
    timeout -k 3 $lim "$NCU" --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu-p8k" \
        "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=4" --ids "$(ids 8192)" --max-new-tokens 1 \
        --device cuda --disable-cuda-graph --prefix-cache off "${PLANS[@]}" >"$OUT/ncu-p8k.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|==WARNING|error:" "$OUT/ncu-p8k.out" | head -5
    if [ -f "$OUT/ncu-p8k.ncu-rep" ]; then
        timeout 20 "$NCU" --import "$OUT/ncu-p8k.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-p8k.csv" 2>"$OUT/ncu-p8k.csv.err"
        timeout 20 python3 bench/device/prefill8k_table.py "$OUT/ncu-p8k.csv" p8k 2048,2048,2048,2048 1 3 ||
            head -c 400 "$OUT/ncu-p8k.csv.err"
    fi
else
    echo "== ncu: skipped (${NCU:-no ncu}; $(left) s left)"
fi
# the opt-in wgmma GEMMs of the grouped MoE (LASTSTAND_MG_WGMMA=1, moe_wgmma.cu): fp64 verdicts and
# times against mg_gemm_kernel's, and the pytest file
if [ "$(left)" -gt 45 ]; then
    for v in 0 1; do
        echo "== doctor: moe cuda_grouped_gemm, 35B shapes, M = 1024, 2048, 8192, LASTSTAND_MG_WGMMA=$v $(el)"
        LASTSTAND_MG_WGMMA=$v timeout -k 3 25 "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b --families moe \
            --m 1024,2048,8192 --backends cuda_grouped_gemm --json "$OUT/doctor-wg$v.json" >"$OUT/doctor-wg$v.txt" \
            2>"$OUT/doctor-wg$v.err"
        echo "rc=$? $(el)"
        grep -E "^ +(1024|2048|8192) " "$OUT/doctor-wg$v.txt" | cut -c1-130
        python3 -c "import json,sys;d=json.load(open(sys.argv[1]));[print('   ',m,c['status'],c.get('rel_err',c.get('detail',''))) for t in d['tables'] for m,c in t['cells']['cuda_grouped_gemm'].items()]" \
            "$OUT/doctor-wg$v.json" 2>/dev/null | head -4
        grep -iE "crash|error|wrong|timeout" "$OUT/doctor-wg$v.err" | head -3
    done
    echo "== doctor: attention cuda_flash_prefill, 35B shapes, M = 512, 3072, LASTSTAND_FP_LPT=1 $(el)"
    LASTSTAND_FP_LPT=1 timeout -k 3 20 "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b --families attention \
        --m 512,3072 --backends cuda_flash_prefill --json "$OUT/doctor-lpt.json" >"$OUT/doctor-lpt.txt" 2>"$OUT/doctor-lpt.err"
    echo "rc=$? $(el)"
    grep -E "^ +(512|3072) " "$OUT/doctor-lpt.txt" | cut -c1-130
    grep -iE "crash|error|wrong|timeout" "$OUT/doctor-lpt.err" | head -3
    echo "== pytest tests/test_gpu_moe_wgmma.py -k \"logits or padding\" $(el)"
    BUILD=$D LS_SHARED=$D timeout -k 3 30 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_moe_wgmma.py \
        -k "logits or padding" 2>&1 | tail -8
    echo "rc=$? $(el)"
fi
if [ -n "$NCU" ] && [ "$(left)" -gt 25 ]; then
    lim=$(( $(left) - 5 ))
    [ $lim -gt 45 ] && lim=45
    echo "== ncu sections: the first 16 launches of mg_gemm / gc_chunk / fp_kernel, generate 4 layers, 2048-token prompt (limit $lim s) $(el)"
    timeout -k 3 $lim "$NCU" --clock-control none --kernel-name regex:"mg_gemm|gc_chunk|fp_kernel" --launch-count 16 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats -o "$OUT/ncu-sec" \
        "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=4" --ids "$(ids 2048)" --max-new-tokens 1 \
        --device cuda --disable-cuda-graph --prefix-cache off "${PLANS[@]}" >"$OUT/ncu-sec.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|error:" "$OUT/ncu-sec.out" | head -5
    if [ -f "$OUT/ncu-sec.ncu-rep" ]; then
        timeout 20 "$NCU" --import "$OUT/ncu-sec.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-sec.csv" 2>"$OUT/ncu-sec.csv.err"
        timeout 20 python3 bench/device/prefill8k_ncu.py "$OUT/ncu-sec.csv" || head -c 400 "$OUT/ncu-sec.csv.err"
    fi
fi
if [ "$(left)" -gt 20 ]; then
    echo "== doctor: 35B shapes, M = 2048, 8192, gemm cuda_cublaslt, moe cuda_grouped_gemm $(el)"
    timeout -k 3 30 "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b --families gemm,moe --m 2048,8192 \
        --backends cuda_cublaslt,cuda_grouped_gemm --json "$OUT/doctor.json" >"$OUT/doctor.txt" 2>"$OUT/doctor.err"
    echo "rc=$? $(el)"
    grep -E "^(gemm|moe) |^ +(2048|8192) " "$OUT/doctor.txt" | cut -c1-130
    grep -iE "crash|error|wrong|timeout" "$OUT/doctor.err" | head -3
    for bm in 32; do
        echo "== doctor: moe cuda_grouped_gemm, M = 2048, 8192, LASTSTAND_GROUPED_BM=$bm (default: 64 at these M) $(el)"
        LASTSTAND_GROUPED_BM=$bm timeout -k 3 20 "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b --families moe \
            --m 2048,8192 --backends cuda_grouped_gemm --json "$OUT/doctor-bm$bm.json" >"$OUT/doctor-bm$bm.txt" \
            2>"$OUT/doctor-bm$bm.err"
        echo "rc=$? $(el)"
        grep -E "^ +(2048|8192) " "$OUT/doctor-bm$bm.txt" | cut -c1-130
    done

fi
echo "total $(( $(date +%s) - T0 )) s"
