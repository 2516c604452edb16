#!/usr/bin/env bash
# Thirteenth session: the A/B calls on the H200, as run (`OUT=... bash calls.sh N` from anywhere):
#   1: timings of HEAD (.base) vs the working tree and cp.py knobs, a per-kernel profile, Nsight Compute's
#      per-instruction counters of the two parallel kernels (exported per source line);
#   2: the forward output kernel at 4 warps and BK 32, the sequential kernels at 4 warps; the GPU-only cp tests;
#   3: call 2's H 8 slowdown isolated (.v1 = the working tree without the forward-scan d log f);
#   4: the committed candidate against HEAD, then the GPU tests.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
t() {  # label, PYTHONPATH, args...
  local label=$1 pp=$2; shift 2
  echo "$label $(PYTHONPATH=$pp timeout 120 python3 benchmarks/ncu_cp.py --time "$@" 2>&1 | grep TIME)"
}
call1() {
  {
  t base .base
  t new .
  t new_o32w4 . --set BK=32 --set NUM_WARPS=4
  t new_o16w4 . --set BK=16 --set NUM_WARPS=4
  t new_b16w4 . --set BK_BWD=16 --set NUM_WARPS_BWD=4
  t base .base
  t new .
  } | tee $OUT/timings.txt
  PYTHONPATH=. timeout 120 python3 benchmarks/ncu_cp.py --profile 2>&1 | grep -E "cp_|Name" | tee $OUT/profile.txt
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  PYTHONPATH=. timeout 240 $NCU --clock-control none --profile-from-start off -k regex:"cp_bwd_kernel|cp_fwd_o_kernel" \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source yes -f -o $OUT/src \
    python3 benchmarks/ncu_cp.py > $OUT/ncu_log.txt 2>&1; tail -5 $OUT/ncu_log.txt
  for ps in "cuda,sass" "sass" "cuda"; do
    timeout 60 $NCU -i $OUT/src.ncu-rep --page source --csv --print-source $ps > $OUT/src_${ps/,/_}.csv 2> $OUT/src_err.txt
    echo "export $ps: rc=$? $(wc -c < $OUT/src_${ps/,/_}.csv) bytes $(head -c 300 $OUT/src_err.txt)"
  done
  timeout 60 $NCU -i $OUT/src.ncu-rep --page details --csv > $OUT/details.csv 2>&1
  (cd /tmp/tcache && find . -name "cp_*kernel*" | tar -czf $OUT/cubins.tgz -T -)
  gzip -f $OUT/src_*.csv
  ls -la $OUT
  cat $OUT/timings.txt
}
call2() {
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
}
call3() {
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
}
call4() {
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
}
"call$1"
