#!/usr/bin/env bash
# Fifteenth session: the calls on the H200, as run (`OUT=... bash calls.sh N` from anywhere; carry .whl and
# .triton-autotune):
#   1: where the layer's time goes (benchmarks/profile_layer.py: ours and fla's HGRN2Attention, kernel by kernel),
#      then the whole cp GPU test file (stopped at its 360 s limit after 26 of its 42 tests, all passed).
#   2: 32-token chunks for bf16 (cp.BT = 32; backward at 8 and 4 warps) against the default; then, three pytest
#      processes side by side: 15 of the 16 cp tests call 1 did not reach (test_all_gates_saturated was left out of
#      the list by mistake), test_triton_chunk.py, and the other kernel tests.
#   3: after the fix of Triton 3.6's interpreter (`_interpret.py`): the chunk test that failed in call 2 (its
#      CPU-interpreter subprocess) and the cp test left out of call 2.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR && [ -d .triton-autotune ] && cp -rn .triton-autotune/. "$TRITON_CACHE_DIR/"
[ -d /tmp/site/fla ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
tests() {  # limit (s), log name, pytest args...
  local limit=$1 log=$2; shift 2
  PYTHONPATH=. timeout -s INT -k 30 "$limit" python3 -m pytest -q -p no:cacheprovider -rf --durations=5 "$@" \
    > "$OUT/$log" 2>&1
  echo "pytest exit code $? ($log)"; tail -n 8 "$OUT/$log"
}
t() {  # label, args... (cp.py knobs for benchmarks/ncu_cp.py)
  local label=$1; shift
  echo "$label $(PYTHONPATH=. timeout 120 python3 benchmarks/ncu_cp.py --time "$@" 2>&1 | grep TIME)"
}
call1() {
  PYTHONPATH=.:/tmp/site timeout 200 python3 benchmarks/profile_layer.py 2>&1 | tee $OUT/profile_layer.txt
  tests 360 tests_cp.log tests/test_triton_cp.py
}
call2() {
  {
  for r in 1 2; do t base; t bt32 --set BT=32; t bt32w4 --set BT=32 --set NUM_WARPS_BWD=4; done
  t bt32_h8 --set BT=32 --heads 8; t base_h8 --heads 8
  } | tee $OUT/timings.txt
  local rest=(test_long_sequence_slow_decay test_bf16 test_fp16 "test_varlen_equals_per_sequence_runs[lens0]"
    "test_varlen_equals_per_sequence_runs[lens1]" test_same_as_sequential_kernel test_custom_op_registration
    test_compiled_graph_calls_the_custom_ops test_bad_activation_is_a_clear_error "test_gpu_bf16_head_sizes[64]"
    "test_gpu_bf16_head_sizes[128]" "test_gpu_bf16_head_sizes[256]" test_gpu_fp32 test_gpu_varlen_bf16
    test_gpu_torch_compile)
  tests 420 tests_cp_rest.log "${rest[@]/#/tests/test_triton_cp.py::}" &
  tests 420 tests_chunk.log tests/test_triton_chunk.py &
  tests 420 tests_other.log tests/test_triton_norm_swiglu.py tests/test_triton_recurrent.py \
    tests/test_triton_hgrn1.py tests/test_triton_dispatch.py tests/test_cross_entropy.py tests/test_mqar_train.py &
  wait
  cat $OUT/timings.txt
}
call3() {
  tests 300 tests_rerun.log tests/test_triton_chunk.py::test_launch_sweep_script_runs \
    tests/test_triton_cp.py::test_all_gates_saturated
}
"call$1"
