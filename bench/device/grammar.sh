#!/bin/bash
# bench/device/grammar.sh BIN OUTDIR: constrained decoding on the GPU engine.
# tests/test_gpu_grammar.py against BIN (one server: synth:qwen3.5-35b-a3b,layers=8 with the
# demo tokenizer, --device cuda, device sampling): json_schema / named tool call / logit_bias
# outputs validate, and the decode time per token of an unconstrained, a json_schema and a
# logit_bias request (128 tokens each, streamed; the GRAMMAR_TPOT line), then the TPOTs again
# with --disable-cuda-graph.
# Reads nothing from ../shared (the demo tokenizer is written by BIN synth).
# device-limit: 90
set -u
BIN=${1:?usage: grammar.sh BIN OUTDIR}
OUT=${2:?usage: grammar.sh BIN OUTDIR}
D=$(cd "$(dirname "$BIN")" && pwd)
mkdir -p "$OUT"
export BUILD=$D LS_SHARED=$D
python3 -m pytest -q -s -p no:cacheprovider -rfEs --durations=6 tests/test_gpu_grammar.py 2>&1 | tee "$OUT/grammar.log" | \
    grep -E "GRAMMAR_TPOT|passed|failed|error|Error|assert|SKIP" | head -40
# R2: the same TPOTs with every step eager, to split a constrained step's cost between losing
# the CUDA graph and sampling on the host
LS_GRAMMAR_GPU_FLAGS=--disable-cuda-graph timeout 45 python3 -m pytest -q -s -p no:cacheprovider -rfEs \
    tests/test_gpu_grammar.py -k tpot 2>&1 | tee "$OUT/grammar-eager.log" | \
    grep -E "GRAMMAR_TPOT|passed|failed|error|Error|assert|SKIP" | head -20
