#!/usr/bin/env bash
# Fourteenth session: the A/B calls on the H200, as run (`OUT=... bash calls.sh N` from anywhere):
#   1: cp.py's warp counts at 16 (backward, sequential walks, forward output) against HEAD (.base).
#   2: the backward's scan handing dk over (working tree) and the same without the K loop's pipelining (.v2),
#      against HEAD (.base); the cp interpreter-level GPU tests at the working tree.
#   3: d log f's constant from the walk (working tree) against call 2's scan change alone (.v1) and HEAD (.base),
#      then the GPU-only and extreme-gate cp tests.
#   (calls 2-3 as run, folded into `ab` afterwards: the same commands in the same order)
#   4: call 3 with the walk's h tile prefetched one step ahead (working tree), same comparisons.
#   5 (kept: call 2's change, committed): `hgrn2 bench ops` as the issue asks, by gpu_suite.sh's bench step:
#      OUT=$OUT STEPS=bench BENCH_ARGS="--skip hgrn1" BENCH_TIMEOUT=420 BENCH_BUDGET=360 bash benchmarks/gpu_suite.sh
#      (carry .whl .triton-autotune); its outputs are bench_ops.{txt,json} here.
#   6 (review): the scan with one pass-through operand (dk; y − x recomputed) in the working tree against the
#      committed three-operand scan (.v1) and the session's start (.base), then the GPU-only and extreme-gate tests.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
t() {  # label, PYTHONPATH, args...
  local label=$1 pp=$2; shift 2
  echo "$label $(PYTHONPATH=$pp timeout 120 python3 benchmarks/ncu_cp.py --time "$@" 2>&1 | grep TIME)"
}
prof() {  # label, PYTHONPATH, args...
  local label=$1 pp=$2; shift 2
  echo "== profile $label"; PYTHONPATH=$pp timeout 100 python3 benchmarks/ncu_cp.py --profile "$@" 2>&1 | grep -E "cp_"
}
call1() {
  {
  t base .base
  t b16 . --set NUM_WARPS_BWD=16
  t b16k16 . --set NUM_WARPS_BWD=16 --set BK_BWD=16
  t s16 . --set NUM_WARPS_SEQ=16
  t s16k128 . --set NUM_WARPS_SEQ=16 --set BK_SEQ=128
  t o8 . --set NUM_WARPS=8
  t o16k64 . --set NUM_WARPS=16 --set BK=64
  t base .base
  } | tee $OUT/timings.txt
  {
  prof base .base
  prof b16 . --set NUM_WARPS_BWD=16
  prof s16 . --set NUM_WARPS_SEQ=16
  } | tee $OUT/profile.txt
  cat $OUT/timings.txt
}
ab() {  # tests' limit (s), extra `t` lines ("label path args" per line), the profiled label=path pairs, then the
        # label=path pairs timed twice
  local limit=$1 extra=$2 profiled=$3; shift 3
  {
  for r in 1 2; do for lp in "$@"; do t "${lp%%=*}" "${lp#*=}"; done; done
  while read -r line; do [ -n "$line" ] && t $line; done <<< "$extra"
  } | tee $OUT/timings.txt
  for lp in $profiled; do prof "${lp%%=*}" "${lp#*=}"; done | tee $OUT/profile.txt
  PYTHONPATH=. timeout "$limit" python3 -m pytest -q -x tests/test_triton_cp.py -k "gpu or extreme or saturated or fallback" \
    -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/tests_cp.txt
  cat $OUT/timings.txt
}
call2() {
  ab 200 "base_h8 .base --heads 8
new_h8 . --heads 8
base_b2x8192 .base --shape 2x8192
new_b2x8192 . --shape 2x8192" "base=.base new=." base=.base new=. v2=.v2
}
call3() {
  ab 240 "base_b2x8192 .base --shape 2x8192
new_b2x8192 . --shape 2x8192
base_b1x32768 .base --shape 1x32768
new_b1x32768 . --shape 1x32768" "v1=.v1 new=." base=.base v1=.v1 new=.
}
call4() { call3; }
call6() {
  ab 240 "base_b2x8192 .base --shape 2x8192
new_b2x8192 . --shape 2x8192" "v1=.v1 new=." base=.base v1=.v1 new=.
}
"call$1"
