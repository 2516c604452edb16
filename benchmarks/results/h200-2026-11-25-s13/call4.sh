#!/usr/bin/env bash
# Thirteenth session, call 4: the committed candidate (new defaults: forward output kernel at 4 warps and BK 32;
# d log f by a forward scan; chunk tier without the verdict load) against HEAD (.base), then the GPU tests.
#   OUT=... bash benchmarks/results/h200-2026-11-25-s13/call4.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t() {  # label, PYTHONPATH, args...
  local label=$1 pp=$2; shift 2
  echo "$label $(PYTHONPATH=$pp timeout 120 python3 benchmarks/ncu_cp.py --time "$@" 2>&1 | grep TIME)"
}
{
t base .base
t new .
t base .base
t new .
t new_b2x8192 . --shape 2x8192
t base_b2x8192 .base --shape 2x8192
} | tee $OUT/timings.txt
PYTHONPATH=. timeout 100 python3 benchmarks/ncu_cp.py --profile 2>&1 | grep -E "cp_" | tee $OUT/profile.txt
PYTHONPATH=. timeout 150 python3 -m pytest -q -x tests/test_triton_cp.py -k "gpu or extreme or saturated or fallback" 2>&1 | tail -3 | tee $OUT/tests_cp.txt
PYTHONPATH=. timeout 100 python3 -m pytest -q tests/test_triton_dispatch.py 2>&1 | tail -3 | tee $OUT/tests_dispatch.txt
cat $OUT/timings.txt
