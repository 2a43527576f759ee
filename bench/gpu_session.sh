#!/usr/bin/env bash
# A GPU session for llogos' CUDA backend on a lent H100: the GPU tests, then llogos beside
# llama.cpp's CUDA tools on the same synthetic GGUFs (bench/bench_cuda.py --llama-cpp).
#
#   bench/gpu_session.sh prepare       here, once before the session: copies llama.cpp's tools
#                                      (../shared/gpu) and the test fixtures into the ignored .gpu/,
#                                      and gguf's wheel into .whl/ (bench/gpu_wheels.sh)
#   bench/gpu_session.sh tests         tests/test_cuda_gpu.py
#   bench/gpu_session.sh bench-small   smollm2-135m and llama-1b
#   bench/gpu_session.sh bench-8b      llama-8b
#   bench/gpu_session.sh all           the three stages above in turn (longer than one call may run)
#
# Each device stage is one call of the device tool from the repository root, with carry
# [".gpu", ".whl"], and stays under BUDGET_S (570 s): every step runs with what is left of it, so
# the call returns its logs before the 10-minute limit. A call may find a fresh machine, so each
# stage installs what it needs. Everything goes under $OUT (at most 8 files): steps.log holds each
# step's exit status and seconds, env.txt the machine, then <stage>.log and its JUnit XML or JSON.
set -uo pipefail
cd "$(dirname "$0")/.."

START=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
OUT=${OUT:-/tmp/llogos-gpu-out}
PYTHON=${PYTHON:-python3}       # on the GPU machine, the python3 that holds CuPy
SITE=/tmp/llogos-site           # gguf, installed from .whl
MODELS_DIR=/tmp/llogos-bench    # synthetic GGUFs, kept while the machine stays warm
mkdir -p "$OUT"

log() { echo "[gpu_session +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/steps.log" >&2; }

# step NAME COMMAND...: run COMMAND within what is left of the budget; log its status and time.
step() {
    local name=$1 left=$(( BUDGET_S - ($(date +%s) - START) )) t0 rc
    shift
    if (( left < 20 )); then
        log "$name: skipped, ${left} s of the budget left"
        return 124
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
    du -sh .gpu .whl
    echo "carry: [\".gpu\", \".whl\"]; with the checkout, $(du -sc .gpu .whl $(git ls-files --cached --others --exclude-standard) 2>/dev/null | tail -1 | cut -f1) KiB travel (limit 64 MiB)"
}

setup() {
    ls .whl/*.whl >/dev/null 2>&1 && [[ -f .gpu/llama-env.sh ]] ||
        { log "setup: .gpu/ or .whl/ missing: run 'bench/gpu_session.sh prepare' here and carry both"; exit 2; }
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl ||
        { log "setup: installing .whl/ failed"; exit 2; }
    export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
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

tests() {
    step tests "$PYTHON" -m pytest -q -ra tests/test_cuda_gpu.py --junitxml="$OUT/tests.xml" 2>&1 | tee "$OUT/tests.log"
}

bench() {  # bench NAME MODELS
    # shellcheck disable=SC1091
    source .gpu/llama-env.sh   # unpacks llama.cpp's tools into /tmp/llama-cuda, puts them on PATH
    step "bench-$1" "$PYTHON" bench/bench_cuda.py --models "$2" --llama-cpp --dir "$MODELS_DIR" \
        --json "$OUT/bench-$1.json" 2>&1 | tee "$OUT/bench-$1.log"
}

stage=${1:-}
case "$stage" in
    prepare) prepare ;;
    tests) setup && tests ;;
    bench-small) setup && bench small smollm2-135m,llama-1b ;;
    bench-8b) setup && bench 8b llama-8b ;;
    all) setup && { tests; bench small smollm2-135m,llama-1b; bench 8b llama-8b; } ;;
    *) echo "usage: bench/gpu_session.sh prepare|tests|bench-small|bench-8b|all" >&2; exit 2 ;;
esac
