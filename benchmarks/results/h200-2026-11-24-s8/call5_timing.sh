set -u
export PYTHONPATH=.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=.:/tmp/site
export TRITON_CACHE_AUTOTUNING=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, fla, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, 'transformers', transformers.__version__)"
echo "== cp check H8 ($(date -u +%T))"
timeout 200 python3 benchmarks/gpu_cp_check.py --timings-only --heads 8 --shapes 8x2048 --total-s 180 --out $OUT/cp > $OUT/cp_check.txt 2>&1
tail -n 16 $OUT/cp_check.txt
echo "== bench train hgrn2, cp.SAVE_A=True ($(date -u +%T))"
timeout 150 python3 -c "
from hgrn2.ops.triton import cp; cp.SAVE_A = True
from hgrn2.cli import main; main(['bench', 'train', '--models', 'hgrn2', '--shapes', '8x2048', '--out', '$OUT/bench_train_save_a.json'])
" > $OUT/bench_train_save_a.txt 2>&1; tail -n 5 $OUT/bench_train_save_a.txt
echo "== bench train hgrn2, llama, fla ($(date -u +%T))"
timeout 330 python3 -m hgrn2.cli bench train --models hgrn2,llama,fla --shapes 8x2048 --out $OUT/bench_train.json > $OUT/bench_train.txt 2>&1
echo "exit $?"; tail -n 8 $OUT/bench_train.txt
(cd /tmp/tcache && find . -name "*.autotune.json" | tar -cf $OUT/triton-autotune.tar -T -)
rm -f $OUT/cp/*.png
ls -R $OUT | head
