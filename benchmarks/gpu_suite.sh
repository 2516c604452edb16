#!/usr/bin/env bash
# The GPU test suite and the benchmarks on any CUDA machine, from the repository root:
#   OUT=/some/dir bash benchmarks/gpu_suite.sh [STEP ...]        (default steps: tests ops layer train)
# Steps: tests (the op, layer and model tests, GPU ones included; TESTS=... to choose, e.g. TESTS='tests/train -m gpu'
# for the training loops' CUDA-graph tests; SHARD=I/N one part of them,
# WORKERS=K pytest processes side by side), tests-quick (every kernel variant once against fp64), ops, layer,
# fla-warmup, train, generate, vision, parity (DATA=a `hgrn2 data prepare` directory of real text), profile, accuracy,
# convert-fla, memory, ddp (needs 2 GPUs). Each bench step writes its JSON to
# $OUT/results/<device>/<benchmark>.json and its log to $OUT/<step>.log; copy the JSONs into benchmarks/results/
# and run `hgrn2 bench report` to update BENCHMARKS.md.
# fla autotunes its kernels on first use (minutes on a cold cache): TRITON_CACHE_AUTOTUNING=1 keeps the results
# in $TRITON_CACHE_DIR, so later steps and later runs on the same GPU kind skip it. WHEELS=DIR installs the
# wheels in DIR first (for a machine without a package index).
set -uo pipefail
OUT=${OUT:-/tmp/hgrn2_gpu}
STEPS=${*:-tests ops layer train}
LIMIT=${LIMIT:-580}  # seconds per step (rows already measured stay in the JSON when a step hits it)
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
if [ -n "${WHEELS:-}" ]; then  # an offline machine: the extras (e.g. flash-linear-attention) from local wheels
  python3 -m pip install -q --no-index --no-deps --target "$OUT/site" "$WHEELS"/*.whl
  export PYTHONPATH=$OUT/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TRITON_CACHE_AUTOTUNING=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$OUT/triton-cache}
RESULTS="$OUT/results/$(python3 -c 'import torch; from hgrn2.bench.common import device_name, device_slug
print(device_slug(device_name("cuda")))')"
python3 -m hgrn2.cli info | tee "$OUT/info.log"

step_cmd() {  # the command of one step; its output goes to $OUT/<step>.log
  case $1 in
    tests) timeout -s INT "${TESTS_TIMEOUT:-3000}" python3 -m hgrn2.cli bench tests --out "$RESULTS" \
             ${WORKERS:+--workers "$WORKERS"} ${TESTS:-tests/ops tests/layers tests/models} \
             ${SHARD:+--shard "$SHARD"} -rf ;;
    tests-quick) timeout -s INT "$LIMIT" python3 -m hgrn2.cli bench tests --quick --workers "${WORKERS:-1}" \
                   --out "$RESULTS" -rf ;;
    ops) timeout "$LIMIT" python3 -m hgrn2.cli bench ops --skip hgrn1 --budget-s $((LIMIT - 160)) --out "$RESULTS" ;;
    fla-warmup)  # fla's autotuning alone (minutes on a cold cache), so that the timed steps after it skip it
      timeout "$LIMIT" python3 -m hgrn2.cli bench train --models fla --shapes 8x2048,4x4096 --warmup 1 --steps 1 \
        --rounds 1 --out "$OUT/warmup" ;;
    layer | accuracy | convert-fla | memory) timeout "$LIMIT" python3 -m hgrn2.cli bench "$1" --out "$RESULTS" ;;
    train) timeout "$LIMIT" python3 -m hgrn2.cli bench train --models hgrn2,hgrn2+graph,fla,llama --out "$RESULTS" ;;
    generate) timeout "$LIMIT" python3 -m hgrn2.cli bench generate --budget-s $((LIMIT - 160)) --out "$RESULTS" ;;
    vision) timeout "$LIMIT" python3 -m hgrn2.cli bench vision --out "$RESULTS" ;;
    parity) timeout "$LIMIT" python3 -m hgrn2.cli bench train-parity --data "${DATA:?DATA=dir}" --out "$RESULTS" ;;
    profile) timeout "$LIMIT" python3 -m hgrn2.cli bench profile --target layer --out "$RESULTS" &&
             timeout "$LIMIT" python3 -m hgrn2.cli bench profile --target train --out "$RESULTS" ;;
    ddp) timeout "$LIMIT" python3 benchmarks/gpu_ddp.py --out "$RESULTS"x2 ;;
    *) echo "unknown step $1"; return 2 ;;
  esac
}

for step in $STEPS; do
  echo "== $step ($(date -u +%H:%M:%S))"
  step_cmd "$step" > "$OUT/$step.log" 2>&1
  echo "exit code $? (124: timed out)"
  tail -n 25 "$OUT/$step.log"
done
