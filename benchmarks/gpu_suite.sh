#!/usr/bin/env bash
# The GPU test suite and the benchmarks on any CUDA machine, from the repository root:
#   OUT=/some/dir bash benchmarks/gpu_suite.sh [STEP ...]        (default steps: tests ops layer train)
# Steps: tests (the op, layer and model tests, GPU ones included; TESTS=... to choose), ops, layer, train,
# profile, accuracy, convert-fla, memory, ddp (needs 2 GPUs). Each bench step writes its JSON to $OUT/results/<device>/<benchmark>.json and its log to
# $OUT/<step>.log; copy the JSONs into benchmarks/results/ and run `hgrn2 bench report` to update BENCHMARKS.md.
# fla autotunes its kernels on first use (minutes on a cold cache): TRITON_CACHE_AUTOTUNING=1 keeps the results
# in $TRITON_CACHE_DIR, so later steps and later runs on the same GPU kind skip it.
set -uo pipefail
OUT=${OUT:-/tmp/hgrn2_gpu}
STEPS=${*:-tests ops layer train}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TRITON_CACHE_AUTOTUNING=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$OUT/triton-cache}
RESULTS="$OUT/results/$(python3 -c 'import torch; from hgrn2.bench.common import device_name, device_slug
print(device_slug(device_name("cuda")))')"
python3 -m hgrn2.cli info | tee "$OUT/info.log"

step_cmd() {  # the command of one step; its output goes to $OUT/<step>.log
  case $1 in
    tests) timeout -s INT "${TESTS_TIMEOUT:-3000}" python3 -m pytest -q -p no:cacheprovider -rf \
             ${TESTS:-tests/ops tests/layers tests/models} ;;
    ops) timeout 900 python3 -m hgrn2.cli bench ops --budget-s 600 --out "$RESULTS" ;;
    layer | accuracy | convert-fla | memory) timeout 900 python3 -m hgrn2.cli bench "$1" --out "$RESULTS" ;;
    train) timeout 1200 python3 -m hgrn2.cli bench train --out "$RESULTS" ;;
    profile) timeout 900 python3 -m hgrn2.cli bench profile --target layer --out "$RESULTS" &&
             timeout 900 python3 -m hgrn2.cli bench profile --target train --out "$RESULTS" ;;
    ddp) timeout 1200 python3 benchmarks/gpu_ddp.py --out "$RESULTS"x2 ;;
    *) echo "unknown step $1"; return 2 ;;
  esac
}

for step in $STEPS; do
  echo "== $step ($(date -u +%H:%M:%S))"
  step_cmd "$step" > "$OUT/$step.log" 2>&1
  echo "exit code $? (124: timed out)"
  tail -n 25 "$OUT/$step.log"
done
