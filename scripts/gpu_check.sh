#!/usr/bin/env bash
# The trainer's GPU checks on an offline machine with an NVIDIA GPU, Python, torch and
# transformers but none of rlkube's other dependencies: `make gpu-check` (or this script) in the
# repository root.
#
# 1. installs the wheels in .whl/ (made beforehand where a registry is reachable: `make
#    gpu-wheels`) into a private site directory, without touching the machine's packages;
# 2. runs the `gpu`-marked trainer tests;
# 3. runs benchmarks/trainer_throughput.py (Qwen3-0.6B by default: GPU_CHECK_MODELS) with the
#    publish before the overlap beside it (--before) and a restarted trainer's first step
#    (--restart); every figure in $GPU_CHECK_REPORT/throughput.json (default: $GPU_CHECK_OUT).
#
# Compiled kernels go to $GPU_CHECK_OUT/compile_cache (default outputs/gpu-check, git-ignored):
# carry that folder to the next machine of the same kind and the compile (~3 minutes of the
# first step on an H100) is not paid again. Each stage has its own time limit; a failed stage
# does not stop the next, and the script fails if any did.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
WORK=${GPU_CHECK_OUT:-outputs/gpu-check}
SITE=${GPU_CHECK_SITE:-/tmp/rlkube-gpu-site}
MODELS=${GPU_CHECK_MODELS:-Qwen3-0.6B}
REPORT=${GPU_CHECK_REPORT:-$WORK}

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu-check: no CUDA device visible to $PY ($("$PY" -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1)): nothing checked" >&2
    exit 1
fi

shopt -s nullglob
wheels=(.whl/*.whl)
if ((${#wheels[@]})); then
    "$PY" -m pip install --quiet --no-index --no-deps --upgrade --target "$SITE" "${wheels[@]}"
else
    echo "gpu-check: no wheels in .whl/ (make gpu-wheels where a registry is reachable); using what is installed" >&2
fi
export PYTHONPATH="$SITE:$PWD/runtime:$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$WORK" "$REPORT"
WORK=$(realpath "$WORK")

failed=()
echo "== gpu tests"
# plugins named, not discovered: the machine's own pytest plugins may not match the carried pytest
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 TORCHINDUCTOR_CACHE_DIR="$WORK/compile_cache/tests" \
    timeout "${GPU_CHECK_TESTS_S:-200}" "$PY" -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -p pytest_timeout \
    -m gpu tests/trainer/rl/test_cuda.py tests/trainer/rl/test_publish.py || failed+=("gpu tests")

echo "== trainer throughput"
# shellcheck disable=SC2086 - MODELS is a list
timeout "${GPU_CHECK_BENCH_S:-480}" "$PY" benchmarks/trainer_throughput.py --models $MODELS --before --restart \
    --output-dir "$WORK" --json "$REPORT/throughput.json" || failed+=("trainer throughput")

if ((${#failed[@]})); then
    echo "gpu-check: failed: ${failed[*]}" >&2
    exit 1
fi
