#!/usr/bin/env bash
# Thirteenth session, call 1: A/B timings of the cp op (HEAD carried as .base vs the working tree, cp.py knobs),
# a per-kernel profile, and Nsight Compute's per-instruction counters of the two parallel kernels.
#   OUT=... bash benchmarks/results/h200-2026-11-25-s13/call1.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
t() {  # label, PYTHONPATH, args...
  local label=$1 pp=$2; shift 2
  echo "$label $(PYTHONPATH=$pp timeout 120 python3 benchmarks/ncu_cp.py --time "$@" 2>&1 | grep TIME)"
}
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
