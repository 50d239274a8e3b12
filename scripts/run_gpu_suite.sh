#!/usr/bin/env bash
# The GPU verification suite in one command (about 5 minutes on an H200; the stage limits add
# up to 9.5 minutes, inside the device tool's 10-minute command limit):
#
#   scripts/run_gpu_suite.sh
#
#   1. pytest tests/gpu, on pytest-xdist workers sharing the GPU (the tests that take gigabytes
#      run one after another on one worker), writing gpu-report.jsonl: one record per
#      (case, tensor) with the fraction bit-identical to the reference composite and the ulp
#      distance;
#   2. tests/gpu/sanitizer_cases.py once plainly (it compiles every kernel variant into the
#      Triton cache), then under compute-sanitizer --tool memcheck and --tool racecheck;
#   3. a summary, printed last and saved as summary.txt.
#
# Results go to $OUT when set, else ./gpu-results: environment.txt, gpu-pytest.log,
# gpu-pytest.xml, gpu-report.jsonl, sanitizer-plain.log, sanitizer-memcheck.log,
# sanitizer-racecheck.log, summary.txt. Exit status 0 when every stage passed.
#
# Knobs (environment): PYTHON (python3), GPU_SUITE_WORKERS (12), GPU_SUITE_PYTEST_LIMIT (270 s),
# GPU_SUITE_SANITIZER_LIMIT (120 s per tool; the plain run gets half), TRITON_CACHE_DIR
# (/tmp/gatednorm-triton-cache).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
RESULTS=${OUT:-$REPO/gpu-results}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
WORKERS=${GPU_SUITE_WORKERS:-12}
PYTEST_LIMIT=${GPU_SUITE_PYTEST_LIMIT:-270}
SANITIZER_LIMIT=${GPU_SUITE_SANITIZER_LIMIT:-120}

export OUT=$RESULTS  # the tests write gpu-report.jsonl under $OUT
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# The compiled kernels, not the interpreter (tests/conftest.py defaults the CPU suite to it).
export TRITON_INTERPRET=0
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/gatednorm-triton-cache}
# One Inductor compile thread per process: twelve workers each with a pool of 16 would
# oversubscribe the CPUs and the memory.
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-1}

START=$(date +%s)
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)

# -- environment --------------------------------------------------------------------------------
if COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null); then
    git -C "$REPO" diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT (working tree differs)"
else
    COMMIT=unknown
fi
{
    echo "date       $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit     $COMMIT"
    echo "gpu        $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
    "$PYTHON" - <<'EOF'
import sys
import torch
import triton
print(f"python     {sys.version.split()[0]}")
print(f"torch      {torch.__version__} (CUDA {torch.version.cuda})")
print(f"triton     {triton.__version__}")
print(f"device     {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
EOF
    echo "sanitizer  $([ -n "$SANITIZER" ] && "$SANITIZER" --version 2>/dev/null | tail -n 1 || echo 'not found')"
    echo "command    scripts/run_gpu_suite.sh (workers $WORKERS)"
} > "$RESULTS/environment.txt" 2>&1
cat "$RESULTS/environment.txt"

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "no CUDA device: the GPU suite needs one (tests/gpu skips itself without)" >&2
    exit 2
fi

# -- 1. pytest ----------------------------------------------------------------------------------
echo
echo "== 1/3 pytest tests/gpu (limit ${PYTEST_LIMIT}s) =="
plugins=()
if [ "$WORKERS" -gt 1 ] && "$PYTHON" -c 'import xdist' 2>/dev/null; then
    plugins+=(-n "$WORKERS" --dist loadgroup)
fi
if "$PYTHON" -c 'import pytest_timeout' 2>/dev/null; then
    plugins+=(--timeout=240)
fi
# SIGINT on the limit: pytest stops, reports what ran and stops its workers.
timeout -s INT -k 30 "$PYTEST_LIMIT" "$PYTHON" -m pytest tests/gpu -q -rfE -p no:cacheprovider \
    ${plugins[@]+"${plugins[@]}"} --junitxml="$RESULTS/gpu-pytest.xml" \
    2>&1 | tee "$RESULTS/gpu-pytest.log"
PYTEST_RC=${PIPESTATUS[0]}

# -- 2. compute-sanitizer -----------------------------------------------------------------------
echo
echo "== 2/3 sanitizer cases: plain, memcheck, racecheck (limit ${SANITIZER_LIMIT}s each) =="
timeout -k 10 $(( SANITIZER_LIMIT / 2 )) "$PYTHON" tests/gpu/sanitizer_cases.py \
    2>&1 | tee "$RESULTS/sanitizer-plain.log"
PLAIN_RC=${PIPESTATUS[0]}
# Memory-access and shared-memory verdicts only: PyTorch and Triton make CUDA API calls that
# fail on purpose (probing), which memcheck would otherwise count as errors.
sanitizer_flags=(--error-exitcode 3 --print-limit 50)
if [ -n "$SANITIZER" ] && "$SANITIZER" --help 2>/dev/null | grep -q -- '--report-api-errors'; then
    sanitizer_flags+=(--report-api-errors no)
fi
declare -A TOOL_RC
for tool in memcheck racecheck; do
    if [ -z "$SANITIZER" ]; then
        echo "compute-sanitizer not found" | tee "$RESULTS/sanitizer-$tool.log"
        TOOL_RC[$tool]=127
        continue
    fi
    echo "-- $tool"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$SANITIZER_LIMIT" \
        "$SANITIZER" --tool "$tool" "${sanitizer_flags[@]}" \
        "$PYTHON" tests/gpu/sanitizer_cases.py 2>&1 | tee "$RESULTS/sanitizer-$tool.log"
    TOOL_RC[$tool]=${PIPESTATUS[0]}
done

# -- 3. summary ---------------------------------------------------------------------------------
verdict() {  # exit status -> word
    case $1 in
        0) echo "PASS" ;;
        124) echo "TIMEOUT" ;;
        127) echo "NOT RUN" ;;
        *) echo "FAIL($1)" ;;
    esac
}
{
    echo
    echo "== 3/3 gatednorm GPU suite summary =="
    cat "$RESULTS/environment.txt"
    echo
    printf '%-10s %-9s %s\n' pytest "$(verdict "$PYTEST_RC")" \
        "$(grep -E '[0-9]+ (passed|failed|error)' "$RESULTS/gpu-pytest.log" | tail -n 1)"
    printf '%-10s %-9s %s\n' plain "$(verdict "$PLAIN_RC")" \
        "$(grep -E 'cases right' "$RESULTS/sanitizer-plain.log" | tail -n 1)"
    printf '%-10s %-9s %s\n' memcheck "$(verdict "${TOOL_RC[memcheck]}")" \
        "$(grep -E 'ERROR SUMMARY' "$RESULTS/sanitizer-memcheck.log" | tail -n 1 | sed 's/^=* *//')"
    printf '%-10s %-9s %s\n' racecheck "$(verdict "${TOOL_RC[racecheck]}")" \
        "$(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$RESULTS/sanitizer-racecheck.log" | tail -n 1 | sed 's/^=* *//')"
    echo
    echo "bit-exact against gatednorm.reference (lowest fraction identical, largest ulp distance):"
    "$PYTHON" -c 'import sys; sys.path.insert(0, "tests/gpu"); import helpers; print(helpers.summarize_report(sys.argv[1]))' \
        "$RESULTS/gpu-report.jsonl"
    echo
    echo "total $(( $(date +%s) - START )) s; results in $RESULTS"
} | tee "$RESULTS/summary.txt"

for rc in "$PYTEST_RC" "$PLAIN_RC" "${TOOL_RC[memcheck]}" "${TOOL_RC[racecheck]}"; do
    [ "$rc" -eq 0 ] || exit 1
done
exit 0
