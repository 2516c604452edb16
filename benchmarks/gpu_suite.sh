#!/usr/bin/env bash
# The GPU jobs, from the repository root, each step under its own time limit (pick STEPS to fit a 10-minute call):
#   OUT=/some/dir STEPS="sweep tests" bash benchmarks/gpu_suite.sh
# Steps (in the order given):
#   tests  the kernel tests on the GPU                       -> $OUT/gpu_tests.log
#   accuracy benchmarks/gpu_accuracy.py (errors per tensor) -> $OUT/accuracy.{txt,json}
#   convert benchmarks/gpu_convert_fla.py (fla checkpoint)   -> $OUT/convert/
#   parallel benchmarks/gpu_chunk_parallel_check.py (kernel check/timing) -> $OUT/parallel/
#   sweep  benchmarks/gpu_fused_chunk_sweep.py (launch tuning) -> $OUT/chunk_sweep.{json,txt}
#   dispatch benchmarks/gpu_dispatch.py (fused-chunk vs chunk-parallel) -> $OUT/dispatch.{json,txt}
#   bench  hgrn2 bench ops (ours, fla, SDPA)                 -> $OUT/bench_ops.{json,txt}
#   mqar   hgrn2 mqar ${MQAR_ARGS:---preset quick}           -> $OUT/mqar.tar (MQAR_MINUTES, default 6)
#   mqar-bg the same sweep in the background, kept across calls; each call waits MQAR_WAIT_S -> $OUT/mqar.tar
#          (both MQAR steps: MQAR_SEED=DIR copies finished runs' JSONs from DIR first, e.g. a committed results dir)
#   profile one MQAR training step: eager, CUDA graph, compiled -> $OUT/profile_mqar.txt
#   train  hgrn2 bench train (ours, fla, Llama)              -> $OUT/bench_train.{json,txt}
#   ddp    2 GPUs (nvidia-h200-x2): the NCCL tests, then benchmarks/gpu_ddp.py -> $OUT/ddp/, $OUT/ddp.txt
# Installs only wheels carried in .whl/ (no internet on the GPU machine); runs the package from the checkout.
# Triton's autotuning results go to $OUT/triton-autotune.tar; extract it into .triton-autotune/ here and carry
# that folder, and the next machine (same GPU kind and Triton) skips the autotuning (fla's takes minutes).
set -uo pipefail
OUT=${OUT:-/tmp/hgrn2_out}
STEPS=${STEPS:-tests}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

if compgen -G ".whl/*.whl" > /dev/null; then
  # once per machine (several suites may run side by side: correctness steps can share the GPU, timings not)
  [ -d /tmp/site/fla ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
# Triton keeps autotuning results on disk, so fla's kernels tune once per call, not once per process
export TRITON_CACHE_AUTOTUNING=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR"
[ -d .triton-autotune ] && cp -rn .triton-autotune/. "$TRITON_CACHE_DIR/"
save_autotune() {  # one file: the device tool brings back only a few files per call
  (cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar -cf "$OUT/triton-autotune.tar" -T -)
}
trap save_autotune EXIT
mqar_seed() {  # MQAR_SEED=DIR: finished runs' JSONs (e.g. a committed results dir), which the sweep skips
  mkdir -p .mqar-sweep/runs
  if [ -n "${MQAR_SEED:-}" ]; then cp -n "$MQAR_SEED"/*.json .mqar-sweep/runs/; fi
}
mqar_collect() {  # LOG: the sweep's results as one $OUT/mqar.tar (a call returns 8 files), its log without the bar
  (cd .mqar-sweep && tar -cf "$OUT/mqar.tar" --exclude=checkpoints .)
  tr '\r' '\n' < "$1" | grep -v -e "MQAR epochs" -e '^\s*$' > "$OUT/mqar.summary.txt"
  tail -n 30 "$OUT/mqar.summary.txt"
}

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
python3 -c "import fla; print('fla', getattr(fla, '__version__', '?'))" 2>&1 | tail -1

for step in $STEPS; do
  echo "== $step ($(date -u +%H:%M:%S))"
  case $step in
    tests)
      # the kernel tests (fla's model tests are left out here: its autotuning alone takes minutes); the
      # chunk-parallel tests alone take most of a call: pass TESTS to fit one.
      # SIGINT at the limit: pytest then still prints the failures so far (a plain kill loses them)
      timeout -s INT -k 30 "${TESTS_TIMEOUT:-500}" python3 -m pytest -q ${TESTS:-tests/ops/triton \
        tests/ops/test_cross_entropy.py} \
        -p no:cacheprovider -rf --durations=8 \
        > "$OUT/gpu_tests.log" 2>&1
      echo "pytest exit code $? (124 = timed out)"
      tail -n 15 "$OUT/gpu_tests.log" ;;
    accuracy)  # rel L2 of every output/gradient vs the fp64 reference, per kernel, dtype and shape
      timeout "${ACCURACY_TIMEOUT:-200}" python3 benchmarks/gpu_accuracy.py ${ACCURACY_ARGS:-} --out "$OUT/accuracy.json" > "$OUT/accuracy.txt" 2>&1
      echo "accuracy exit code $?"
      cat "$OUT/accuracy.txt" ;;
    convert)  # fla's HGRN2 with random weights → ours: logits (fp32, bf16) and greedy generations
      timeout "${CONVERT_TIMEOUT:-300}" python3 benchmarks/gpu_convert_fla.py --out "$OUT/convert" \
        > "$OUT/convert.txt" 2>&1
      echo "convert exit code $?"
      tail -n 12 "$OUT/convert.txt" ;;
    parallel)
      timeout "${PARALLEL_TIMEOUT:-250}" python3 benchmarks/gpu_chunk_parallel_check.py --out "$OUT/parallel" \
        > "$OUT/parallel_check.txt" 2>&1
      echo "chunk-parallel check exit code $?"
      tail -n 40 "$OUT/parallel_check.txt" ;;
    sweep)
      timeout "${SWEEP_TIMEOUT:-540}" python3 benchmarks/gpu_fused_chunk_sweep.py --budget-s "${SWEEP_BUDGET:-480}" \
        --out "$OUT/chunk_sweep.json" ${SWEEP_ARGS:-} > "$OUT/chunk_sweep.txt" 2>&1
      echo "sweep exit code $?"
      tail -n 20 "$OUT/chunk_sweep.txt" ;;
    dispatch)
      timeout "${DISPATCH_TIMEOUT:-240}" python3 benchmarks/gpu_dispatch.py --out "$OUT/dispatch.json" \
        ${DISPATCH_ARGS:-} > "$OUT/dispatch.txt" 2>&1
      echo "dispatch exit code $?"
      tail -n 10 "$OUT/dispatch.txt" ;;
    bench)
      timeout "${BENCH_TIMEOUT:-330}" python3 -m hgrn2.cli bench ops --budget-s "${BENCH_BUDGET:-270}" \
        --out "$OUT/bench_ops.json" ${BENCH_ARGS:-} > "$OUT/bench_ops.txt" 2>&1
      echo "bench exit code $? (124 = timed out; rows measured so far are in the json)"
      grep -iE "error|traceback" "$OUT/bench_ops.txt" | tail -n 8
      python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['table'])" "$OUT/bench_ops.json" \
        || tail -n 30 "$OUT/bench_ops.txt" ;;
    mqar)  # results, table, figure and every run's JSON come back as one $OUT/mqar.tar (a call returns 8 files):
      # `mkdir -p .mqar-sweep && tar -xf mqar.tar -C .mqar-sweep` here and carry .mqar-sweep, and the next call
      # skips the finished runs. In-flight runs' epoch checkpoints stay behind (tens of MB each, more than a
      # call returns): a run cut by MQAR_MINUTES starts again.
      start=$(date +%s)
      mqar_seed
      timeout $(( ${MQAR_MINUTES:-6} * 60 + 60 )) python3 -m hgrn2.cli mqar ${MQAR_ARGS:---preset quick} \
        --out .mqar-sweep --data-dir /tmp/mqar-data --max-minutes "${MQAR_MINUTES:-6}" > "$OUT/mqar.txt" 2>&1
      echo "mqar exit code $? after $(( $(date +%s) - start )) s"
      mqar_collect "$OUT/mqar.txt" ;;
    mqar-bg)  # the sweep in a session of its own (setsid): it outlives the call while the machine stays warm, so
      # its epoch checkpoints stay on the machine; later calls of this step start nothing new, wait up to
      # MQAR_WAIT_S for it and return what has finished as $OUT/mqar.tar. Never carry .mqar-sweep into such a
      # call: the carried copy would replace the folder the sweep writes to.
      if [ ! -f /tmp/mqar.pid ]; then
        mqar_seed
        setsid nohup python3 -m hgrn2.cli mqar ${MQAR_ARGS:---preset quick} --out .mqar-sweep \
          --data-dir /tmp/mqar-data < /dev/null > /tmp/mqar.log 2>&1 &
        echo $! > /tmp/mqar.pid
        echo "mqar started (pid $(cat /tmp/mqar.pid))"
      fi
      start=$(date +%s)
      while kill -0 "$(cat /tmp/mqar.pid)" 2>/dev/null && [ $(( $(date +%s) - start )) -lt "${MQAR_WAIT_S:-540}" ]; do
        sleep 10
      done
      kill -0 "$(cat /tmp/mqar.pid)" 2>/dev/null && echo "mqar still running" || echo "mqar ended"
      mqar_collect /tmp/mqar.log
      tr '\r' '\n' < /tmp/mqar.log | grep "MQAR epochs" | tail -n 1 ;;
    profile)  # one MQAR training step alone: steps/s and where the time goes
      for m in "hgrn2" "attention" "hgrn2 --cuda-graph" "attention --cuda-graph" "hgrn2 --compile"; do
        timeout 120 python3 benchmarks/profile_mqar_step.py --mixer $m --d 128 --L 512 --batch 128 2>&1 | head -34
      done > "$OUT/profile_mqar.txt"
      cat "$OUT/profile_mqar.txt" ;;
    train)
      timeout "${TRAIN_TIMEOUT:-300}" python3 -m hgrn2.cli bench train --out "$OUT/bench_train.json" \
        ${TRAIN_ARGS:-} > "$OUT/bench_train.txt" 2>&1
      echo "bench train exit code $?"
      tail -n 20 "$OUT/bench_train.txt" ;;
    ddp)  # 1 GPU with accumulation vs 2 GPUs with DDP and FSDP2: tiny fp32 (tests), then the 0.15b preset in bf16
      timeout 200 python3 -m pytest -q tests/test_train_ddp.py -k two_gpus -p no:cacheprovider -rf \
        > "$OUT/ddp_tests.log" 2>&1
      echo "pytest exit code $?"
      tail -n 5 "$OUT/ddp_tests.log"
      timeout "${DDP_TIMEOUT:-300}" python3 benchmarks/gpu_ddp.py --out "$OUT/ddp" ${DDP_ARGS:-} > "$OUT/ddp.txt" 2>&1
      echo "gpu_ddp exit code $?"
      rm -rf "$OUT/ddp/data" "$OUT"/ddp/*/final "$OUT"/ddp/*/checkpoints
      tail -n 16 "$OUT/ddp.txt" ;;
    *) echo "unknown step $step" ;;
  esac
done
