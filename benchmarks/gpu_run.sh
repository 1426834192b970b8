#!/usr/bin/env bash
# The prepared GPU run (issue 36), for a bare, offline GPU machine (torch with CUDA, transformers, pytest there):
#   OUT=/some/dir bash benchmarks/gpu_run.sh
# In order of importance, each part with its own time limit (a hang in one still leaves the others):
# 1. `pytest -m cuda` (the CUDA rows on the card: one graph per step, a sync heard, a deliberate failed capture
#    followed by a healthy one) and the CPU bookkeeping tests of the step graphs under the machine's versions;
# 2. the decode comparison (benchmarks/gpu_decode.py) on a Llama-3.2-1B-shaped bfloat16 model, then llama-tiny;
# 3. generate() tokens/s against Hugging Face's static-cache recipe (benchmarks/gpu_generate.py);
# 4. the product end to end on the card: `superkernel optimize --device cuda` on llama-tiny (report, chart,
#    plan), then `superkernel bench --config` of its plan on the card (prepared, not yet run on a GPU).
# 5. quant: the decode comparison on the Llama-3.2-1B shape quantized int8 weight-only by torchao (torchao is not in
#    the image: carry its wheel, installed with --target and put on PYTHONPATH before this script);
#    quantcdt: the same with Inductor's coordinate descent searching every direction, radius 2 (a study);
# 6. static: `superkernel static-compile --device cuda` on llama-tiny twice, building a package and then loading it;
# 7. qproduct: `superkernel optimize --device cuda --quantize int8-weight` on llama-tiny (needs torchao as in 5).
# 8. int8gemv: a study, our Triton int8 weight-only GEMV against Inductor's reduction at the 1B step's shapes
#    (benchmarks/studies/cuda_int8_gemv.py; needs no torchao).
# 9. decodekernels (issue 61): our Triton decode kernel set (runtime/cuda/decode_kernels) measured by
#    benchmarks/gpu_decode_kernels.py in four calls with their own limits (DK_M1_LIMIT ... DK_M4_LIMIT; 300 s
#    together): m1 every kernel against cuBLAS F.linear and Inductor at the 1B shapes, m2 a graph of 230 dependent
#    tiny kernels without and with PDL, m3 attention per layer, m4 a 1B-shaped step of the kernel set (bfloat16 and
#    int8 weight-only) against the same work compiled by Inductor.
# 10. dkgenerate (issue 61): generate() on the Llama-3.2-1B shape with all_layers max-autotune and the kernel set
#    hooked up (experimental_config.cuda_decode_kernels) against HF's static-cache recipe in reduce-overhead, then
#    the plan without the set, then the recipe in max-autotune (last: its autotuning compile is the slowest);
#    tokens/s and token equality (benchmarks/gpu_generate.py --tag dk; DK_GEN_LIMIT 180 s). 9 and 10 together:
#    480 s of limits, two calls of the device tool (PARTS=decodekernels, then PARTS=dkgenerate).
# PARTS picks parts (default pytest,big,tiny,generate,product); a lease's second run repeats only what
# the first one showed wrong.
# Everything lands in $OUT: gpu_run.log (all output), gpu_decode_*.{json,md}, gpu_generate_*.{json,md}.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BIG_BUDGET=${BIG_BUDGET:-130}
TINY_BUDGET=${TINY_BUDGET:-40}
BIG_PLANS=${BIG_PLANS:-eager,cudagraphs,cudagraphs-static-params,sk-ro-all_layers,sk-ro-decoder_layer,sk-ro-all_layers-precompiled,inductor-reduce-overhead,sk-ma-all_layers,sk-ma-all_layers-pdl,inductor-max-autotune}
PARTS=",${PARTS:-pytest,big,tiny,generate,product},"
part() { [[ $PARTS == *",$1,"* ]]; }
TINY_PLANS=${TINY_PLANS:-eager,cudagraphs,cudagraphs-static-params,sk-ro-decoder_layer,sk-ro-all_layers,sk-ro-all_layers-precompiled,inductor-reduce-overhead,sk-ma-all_layers,sk-ma-all_layers-pdl}
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv || true
    if part pytest; then
    echo "== pytest -m cuda"
    timeout ${PYTEST_LIMIT:-90} $PY -m pytest -m cuda tests/backend/test_cuda.py tests/backend/test_streams.py -q \
        -p no:cacheprovider -p no:logging -rs -s --durations=10
    echo "== step-graph bookkeeping (CPU, recording fake) under this machine's versions"
    timeout 40 $PY -m pytest tests/backend/test_step_graphs.py -q -p no:cacheprovider -p no:logging
    fi
    if part big; then
    echo "== decode llama-1b"
    timeout $((BIG_BUDGET + 100)) $PY benchmarks/gpu_decode.py --model llama-1b --dtype bfloat16 \
        --budget $BIG_BUDGET --out "$OUT" --plans $BIG_PLANS --rounds ${BIG_ROUNDS:-5}
    fi
    if part tiny; then
    echo "== decode llama-tiny"
    timeout $((TINY_BUDGET + 60)) $PY benchmarks/gpu_decode.py --model llama-tiny --budget $TINY_BUDGET --out "$OUT" \
        --plans $TINY_PLANS
    fi
    if part generate; then
    echo "== generate llama-1b"
    timeout ${GEN_LIMIT:-90} $PY benchmarks/gpu_generate.py --model llama-1b --repeats 2 --out "$OUT" \
        --plans ${GEN_PLANS:-all_layers:reduce-overhead}
    fi
    if part product; then
    echo "== optimize --device cuda (llama-tiny), then bench --config of its plan"
    timeout ${OPTIMIZE_LIMIT:-150} $PY -m superkernel optimize --model llama-tiny --device cuda \
        --strategy decoder_layer --output "$OUT/optimize_cuda" --quiet
    ls -l "$OUT/optimize_cuda" || true
    timeout ${BENCH_LIMIT:-90} $PY -m superkernel bench --config "$OUT/optimize_cuda/superkernel.yaml" \
        --device cuda
    fi
    if part quant; then
    echo "== decode llama-1b, int8 weight-only"
    timeout $((${QUANT_BUDGET:-110} + 80)) $PY benchmarks/gpu_decode.py --model llama-1b --dtype bfloat16 --quantize int8-weight \
        --budget ${QUANT_BUDGET:-110} --out "$OUT" --plans ${QUANT_PLANS:-eager,sk-ro-all_layers,sk-ma-all_layers,inductor-max-autotune} \
        --rounds ${BIG_ROUNDS:-5}
    fi
    if part quantcdt; then
    echo "== decode llama-1b, int8 weight-only, coordinate descent in every direction (a study)"
    timeout $((${QUANT_BUDGET:-110} + 80)) $PY benchmarks/gpu_decode.py --model llama-1b --dtype bfloat16 --quantize int8-weight \
        --budget ${QUANT_BUDGET:-110} --out "$OUT" --plans ${QUANT_PLANS:-eager,sk-ma-all_layers,inductor-max-autotune} \
        --rounds ${BIG_ROUNDS:-5} --inductor-patch coordinate_descent_check_all_directions=true,coordinate_descent_search_radius=2
    fi
    if part static; then
    echo "== static-compile --device cuda (llama-tiny): build, then the same command loads the package"
    STATIC_DIR=${STATIC_DIR:-$OUT/static}
    mkdir -p "$STATIC_DIR"
    for attempt in ${STATIC_ATTEMPTS:-build load}; do
        echo "-- $attempt"
        timeout ${STATIC_LIMIT:-70} $PY -m superkernel static-compile --model llama-tiny --device cuda \
            --build-dir "$STATIC_DIR"
    done
    timeout 30 $PY -m superkernel static-compile --list "$STATIC_DIR"
    fi
    if part qproduct; then
    echo "== optimize --device cuda --quantize int8-weight (llama-tiny)"
    timeout ${QPRODUCT_LIMIT:-100} $PY -m superkernel optimize --model llama-tiny --device cuda --quantize int8-weight \
        --strategy decoder_layer --output "$OUT/optimize_cuda_int8" --quiet
    fi
    if part int8gemv; then
    echo "== int8 weight-only GEMV: our Triton kernel against Inductor's reduction (a study)"
    timeout ${GEMV_LIMIT:-150} $PY benchmarks/studies/cuda_int8_gemv.py --out "$OUT"
    fi
    if part decodekernels; then
    for p in m1 m2 m3 m4; do
        echo "== decode kernel set, part $p"
        case $p in m1) limit=${DK_M1_LIMIT:-120} ;; m2) limit=${DK_M2_LIMIT:-30} ;; m3) limit=${DK_M3_LIMIT:-30} ;;
            m4) limit=${DK_M4_LIMIT:-120} ;; esac
        timeout $limit $PY benchmarks/gpu_decode_kernels.py --parts $p --out "$OUT"
    done
    fi
    if part dkgenerate; then
    echo "== generate() llama-1b: all_layers max-autotune with the decode kernel set against HF's recipe"
    timeout ${DK_GEN_LIMIT:-180} $PY benchmarks/gpu_generate.py --model llama-1b --repeats 2 --tag dk --out "$OUT" \
        --plans ${DK_GEN_PLANS:-all_layers:max-autotune:decode-kernels,hf:reduce-overhead,all_layers:max-autotune,hf:max-autotune}
    fi
    date -u
} 2>&1 | tee "$OUT/gpu_run.log"
