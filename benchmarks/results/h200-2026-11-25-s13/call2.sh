#!/usr/bin/env bash
# Thirteenth session, call 2: A/B timings of the cp op (HEAD carried as .base vs the working tree with cp.py
# knobs: the forward output kernel at 4 warps and K-blocks of 32, the sequential kernels at 4 warps), then the
# GPU-only cp tests.   OUT=... bash benchmarks/results/h200-2026-11-25-s13/call2.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
t() {  # label, PYTHONPATH, args...
  local label=$1 pp=$2; shift 2
  echo "$label $(PYTHONPATH=$pp timeout 120 python3 benchmarks/ncu_cp.py --time "$@" 2>&1 | grep TIME)"
}
O="--set BK=32 --set NUM_WARPS=4"
{
t base .base
t new .
t new_o . $O
t new_o_s32x128w4 . $O --set BK_SEQ=32 --set NUM_WARPS_SEQ=4
t new_o_s64x64w4 . $O --set BV_SEQ=64 --set NUM_WARPS_SEQ=4
t new_o_h8 . $O --heads 8
t base_h8 .base --heads 8
t base .base
t new_o . $O
} | tee $OUT/timings.txt
PYTHONPATH=. timeout 100 python3 benchmarks/ncu_cp.py --profile $O 2>&1 | grep -E "cp_" | tee $OUT/profile.txt
PYTHONPATH=. timeout 240 python3 -m pytest -q -x tests/test_triton_cp.py -k gpu 2>&1 | tail -4 | tee $OUT/tests.txt
cat $OUT/timings.txt
