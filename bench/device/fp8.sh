#!/usr/bin/env bash
# device-limit: 120
# bench/device/fp8.sh BIN OUTDIR: tests/test_fp8_checkpoints.py with its forward passes on the GPU
# (LS_TEST_DEVICE=cuda): FP8 checkpoints (block-scaled fp8, ModelOpt FP8 per tensor / per row,
# MIXED_PRECISION with NVFP4 experts) dequantized at load give the logits and greedy tokens of the
# BF16 checkpoint holding the same values, bit for bit, on the CUDA kernels too. Fixtures staged
# beside BIN (fixtures/models, as gputests.sh).
. "$(dirname "$0")/lib.sh"
dev_init fp8 115 "$@"
echo "== pytest tests/test_fp8_checkpoints.py, LS_TEST_DEVICE=cuda $(el)"
BUILD=$D LS_SHARED=$D LS_TEST_DEVICE=cuda timeout -k 3 100 python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/test_fp8_checkpoints.py 2>&1 | tail -15
echo "done $(el)"
