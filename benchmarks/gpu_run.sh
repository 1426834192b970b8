#!/usr/bin/env bash
# The prepared GPU run (issue 36), for a bare, offline GPU machine (torch with CUDA, transformers, pytest there):
#   OUT=/some/dir bash benchmarks/gpu_run.sh
# 1. `pytest -m cuda` (the CUDA rows, a deliberate failed capture followed by a healthy one);
# 2. the decode comparison (benchmarks/gpu_decode.py) on llama-tiny (float32) and on a Llama-3.2-1B-shaped
#    bfloat16 model; each writes gpu_decode_<model>_<card>.{json,md} and a log under $OUT.
# Each part has its own time limit so a hang in one still leaves the others' results.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
TINY_BUDGET=${TINY_BUDGET:-50}
BIG_BUDGET=${BIG_BUDGET:-120}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv || true
timeout ${PYTEST_LIMIT:-100} $PY -m pytest -m cuda tests/backend/test_cuda.py tests/backend/test_streams.py -q \
    -p no:cacheprovider -rs --durations=10 2>&1 | tee "$OUT/pytest_cuda.log"
timeout $((TINY_BUDGET + 60)) $PY benchmarks/gpu_decode.py --model llama-tiny --budget $TINY_BUDGET --out "$OUT" \
    2>&1 | tee "$OUT/gpu_decode_llama-tiny.log"
timeout $((BIG_BUDGET + 90)) $PY benchmarks/gpu_decode.py --model llama-1b --dtype bfloat16 --budget $BIG_BUDGET \
    --out "$OUT" ${BIG_PLANS:+--plans $BIG_PLANS} 2>&1 | tee "$OUT/gpu_decode_llama-1b.log"
