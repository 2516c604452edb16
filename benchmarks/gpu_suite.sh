#!/usr/bin/env bash
# The GPU job in one call, from the repository root: GPU tests, then the ops benchmark (< 10 minutes).
#   OUT=/some/dir bash benchmarks/gpu_suite.sh          (BENCH_ARGS="--quick" for a smoke run)
# Writes $OUT/gpu_tests.log, $OUT/bench_ops.json, $OUT/bench_ops.txt; prints a short table last.
# Installs only wheels carried in .whl/ (no internet on the GPU machine); runs the package from the checkout.
set -uo pipefail
OUT=${OUT:-/tmp/hgrn2_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
python3 -c "import fla; print('fla', getattr(fla, '__version__', '?'))" 2>&1 | tail -1

echo "== GPU tests (log: $OUT/gpu_tests.log)"
# the kernel tests (fla's model tests are left out here: its autotuning alone takes minutes)
timeout 200 python3 -m pytest -q tests/test_triton_chunk.py tests/test_triton_recurrent.py tests/test_triton_hgrn1.py \
  -p no:cacheprovider -rf \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest exit code $? (124 = timed out)"
tail -n 15 "$OUT/gpu_tests.log"

echo "== ops benchmark (json: $OUT/bench_ops.json)"
timeout 360 python3 -m hgrn2.cli bench ops --budget-s 300 --out "$OUT/bench_ops.json" ${BENCH_ARGS:-} \
  > "$OUT/bench_ops.txt" 2>&1
echo "bench exit code $? (124 = timed out; rows measured so far are in the json)"
grep -iE "error|traceback" "$OUT/bench_ops.txt" | tail -n 8
python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['table'])" "$OUT/bench_ops.json" \
  || tail -n 30 "$OUT/bench_ops.txt"
