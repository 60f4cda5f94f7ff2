#!/usr/bin/env bash
# Every GPU check in one run, ending in one table (docs/gpu.md). From the repository root, on a
# machine with an NVIDIA GPU and torch with CUDA:
#
#     bash tests/gpu/run_all.sh
#
# Rows: torch on CUDA decodes the CPU's tokens with the committed weights (check_decode_cuda.py);
# the bench with torch on CUDA, W 1-16 (check_bench_gpu.py); ONNX Runtime's CUDA provider against
# its CPU one (check_ort_cuda.py; skipped with the CPU build of onnxruntime); the same for the
# mixture-of-experts graphs, both expert forms, fp32 and int4 (check_moe_cuda.py); self-speculative
# decoding of the tri-mode model with torch on CUDA, spec = ar (check_self_spec_cuda.py); TensorRT engines
# built through Polygraphy and their tokens against ONNX Runtime (check_trt.py; skipped without
# tensorrt or polygraphy).
#
# Environment:
#   OUT     folder for the logs, bench.json, BENCHMARKS.md and summary.md (default build/gpu_checks)
#   PYTHON  the Python with torch (default python3)
#   WHEELS  folder of wheels installed first into a private folder put ahead on PYTHONPATH
#           (pip --no-index --no-deps), e.g. polygraphy, onnxruntime-gpu (default .whl, if present)
# Each check has a time limit; together they stay under 9 minutes.
# Exit status: 0 every check passed or was skipped; 1 a check failed or ran out of time;
# 3 there is no GPU here (one line on stderr, nothing run).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
PY=${PYTHON:-python3}
LOGS=${OUT:-build/gpu_checks}
WHEELS=${WHEELS:-.whl}

no_gpu() {
    echo "run_all.sh: error: no GPU: $1; the GPU checks need an NVIDIA GPU with CUDA" >&2
    exit 3
}
command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi is not on PATH"
nvidia-smi -L >/dev/null 2>&1 || no_gpu "nvidia-smi finds no device"
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1 \
    || no_gpu "torch.cuda.is_available() is not True in $PY"

mkdir -p "$LOGS" || exit 1
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    site=$(mktemp -d /tmp/gpu_site.XXXXXX)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$WHEELS"/*.whl \
        || { echo "run_all.sh: error: cannot install the wheels in $WHEELS" >&2; exit 1; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# name | time limit (s) | command
CHECKS=(
    "decode_cuda|70|$PY tests/gpu/check_decode_cuda.py --n 2"
    "bench_torch_cuda|130|$PY tests/gpu/check_bench_gpu.py --out $LOGS/bench --backends torch --no-plots"
    "ort_cuda|60|$PY tests/gpu/check_ort_cuda.py --n 2"
    "moe_ort_cuda|60|$PY tests/gpu/check_moe_cuda.py"
    "self_spec_cuda|45|$PY tests/gpu/check_self_spec_cuda.py"
    "trt|100|$PY tests/gpu/check_trt.py --n 1"
)

summary_of() {  # the check's last "summary: " line, else its last non-empty line
    local s
    s=$(grep '^summary: ' "$1" | tail -n 1 | cut -c10-)
    [ -n "$s" ] || s=$(grep -v '^[[:space:]]*$' "$1" | tail -n 1)
    printf '%s' "${s:0:300}" | tr '|' '/'
}

header=$("$PY" - <<'EOF' 2>&1
import subprocess
import onnxruntime as ort
import torch
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
try:
    import tensorrt
    trt = tensorrt.__version__
except ImportError:
    trt = "not installed"
print(f"GPU {gpu}; torch {torch.__version__}; onnxruntime {ort.__version__} "
      f"({', '.join(ort.get_available_providers())}); TensorRT {trt}")
EOF
)
echo "$header"

failed=0
rows=()
for entry in "${CHECKS[@]}"; do
    IFS='|' read -r name limit cmd <<<"$entry"
    log="$LOGS/$name.log"
    echo "== $name (limit ${limit} s): $cmd"
    start=$SECONDS
    # shellcheck disable=SC2086  # cmd is a word list
    timeout -k 10 "$limit" $cmd >"$log" 2>&1
    rc=$?
    took=$((SECONDS - start))
    summary=$(summary_of "$log")
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        status="TIMEOUT"; failed=1
    elif [ "$rc" -ne 0 ]; then
        status="FAIL (rc $rc)"; failed=1
    elif [[ "$summary" == skipped* || "$summary" == *": skipped" ]]; then
        status="skipped"
    else
        status="pass"
    fi
    echo "   $status in ${took} s: $summary"
    rows+=("| $name | $status | $took | $summary | \`$log\` |")
done

{
    echo "$header"
    echo
    echo "| check | status | seconds | result | log |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
} >"$LOGS/summary.md"
echo
cat "$LOGS/summary.md"
exit "$failed"
