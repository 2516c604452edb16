#!/usr/bin/env bash
# Thirteenth session, call 3: the H 8 slowdown of call 2 isolated (HEAD as .base; .v1 = the working tree without
# the forward-scan d log f), per-kernel profiles at H 8.   OUT=... bash benchmarks/results/h200-2026-11-25-s13/call3.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t() {  # label, PYTHONPATH, args...
  local label=$1 pp=$2; shift 2
  echo "$label $(PYTHONPATH=$pp timeout 120 python3 benchmarks/ncu_cp.py --time "$@" 2>&1 | grep TIME)"
}
O="--set BK=32 --set NUM_WARPS=4"
{
for H in 8 16; do
t base .base --heads $H
t v1 .v1 --heads $H
t new . --heads $H
t v1_o .v1 $O --heads $H
t new_o . $O --heads $H
done
t base_h8 .base --heads 8
t new_o_h8 . $O --heads 8
} | tee $OUT/timings.txt
{
echo "== profile base H8"; PYTHONPATH=.base timeout 100 python3 benchmarks/ncu_cp.py --profile --heads 8 2>&1 | grep -E "cp_"
echo "== profile new_o H8"; PYTHONPATH=. timeout 100 python3 benchmarks/ncu_cp.py --profile --heads 8 $O 2>&1 | grep -E "cp_"
} | tee $OUT/profile.txt
cat $OUT/timings.txt
