#!/usr/bin/env bash
# Length-extrapolation curve and needle heatmap of a small HGRN2 trained by `hgrn2 train` on real text: CPython's
# documentation topics (pydoc_data, shipped with Python), every 10th topic held out for evaluation; or, with
# TEXT_DIR set, the local corpus TEXT_DIR/train.txt and TEXT_DIR/val.txt.
# usage: [TEXT_DIR=DIR] benchmarks/eval_length_needle.sh OUT_DIR [MAX_STEPS] [SEQ_LEN] [`hgrn2 train --set` KEY=VALUE...]
# Writes OUT_DIR/ppl/ppl.{json,png} (loss by position up to 8x SEQ_LEN) and OUT_DIR/needle/needle.{json,png}.
set -euo pipefail
OUT=${1:?usage: $0 OUT_DIR [MAX_STEPS] [SEQ_LEN] [KEY=VALUE ...]}
STEPS=${2:-300}
SEQ=${3:-128}
shift $(( $# < 3 ? $# : 3 ))
mkdir -p "$OUT/text"
if [[ -n "${TEXT_DIR:-}" ]]; then
  cp "$TEXT_DIR/train.txt" "$TEXT_DIR/val.txt" "$OUT/text/"
else
  python - "$OUT/text" <<'PY'
import os
import sys

from pydoc_data.topics import topics

keys = sorted(topics)
for name, part in (("train", [k for i, k in enumerate(keys) if i % 10]), ("val", keys[::10])):
    with open(os.path.join(sys.argv[1], f"{name}.txt"), "w") as f:
        f.write("\n\n".join(topics[k].strip() for k in part) + "\n")
PY
fi
python -m hgrn2.cli data prepare "$OUT/text/train.txt" --val-inputs "$OUT/text/val.txt" --sample-by document \
  --train-tokenizer 2048 --out "$OUT/data" --overwrite
python -m hgrn2.cli train --config tiny --set data="$OUT/data" out_dir="$OUT/run" max_steps="$STEPS" seq_len="$SEQ" \
  eval_every="$STEPS" save_every="$STEPS" "$@"
python -m hgrn2.cli eval ppl "$OUT/run/final" "$OUT/data" --split val --sequences stream --length $((SEQ * 8)) \
  --train-length "$SEQ" --bin $((SEQ / 4)) --out "$OUT/ppl"
LENGTHS=256  # needle and question take ~130 tokens of a 2048-token BPE; powers of two up to 16x SEQ_LEN
for ((n = 512; n <= SEQ * 16; n *= 2)); do LENGTHS="$LENGTHS,$n"; done
python -m hgrn2.cli eval needle "$OUT/run/final" --haystack "$OUT/text/val.txt" --mode easy \
  --lengths "$LENGTHS" --depths 11 --out "$OUT/needle"
