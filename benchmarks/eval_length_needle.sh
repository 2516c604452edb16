#!/usr/bin/env bash
# Does a small HGRN2 trained by `hgrn2 train` on real text at SEQ_LEN tokens keep its loss flat past SEQ_LEN when its
# state is carried (up to 8x), and can it retrieve a needle from held-out text? Assembles a corpus with
# `hgrn2 data corpus SOURCE` (python-docs: CPython's help topics, always installed; debian-docs: python3-doc and
# linux-doc, tens of MB), trains a byte-level BPE and the model, then writes the records eval_ppl.json and
# eval_needle.json with their PNGs into RECORD_DIR (default benchmarks/results/<device>/) for `hgrn2 bench report`.
# usage: benchmarks/eval_length_needle.sh OUT_DIR [SOURCE] [MAX_BYTES] [MAX_STEPS] [SEQ_LEN] [`hgrn2 train --set`
#        KEY=VALUE...]; environment: RECORD_DIR, VOCAB (BPE size, 4096), SEQUENCES (held-out sequences of 8 x SEQ_LEN
#        tokens scored, 128), NEEDLE_MODE (passkey | easy | standard), TRIALS (per needle cell, 1).
set -euo pipefail
OUT=${1:?usage: $0 OUT_DIR [SOURCE] [MAX_BYTES] [MAX_STEPS] [SEQ_LEN] [KEY=VALUE ...]}
SOURCE=${2:-python-docs}
MAX_BYTES=${3:-20M}
STEPS=${4:-300}
SEQ=${5:-256}
shift $(( $# < 5 ? $# : 5 ))
RECORD=(--record ${RECORD_DIR:+"$RECORD_DIR"})
hgrn2() { python -m hgrn2.cli "$@"; }
hgrn2 data corpus "$SOURCE" "$OUT/corpus" --max-bytes "$MAX_BYTES" --overwrite
hgrn2 data prepare "$OUT/corpus/train" --val-inputs "$OUT/corpus/valid" --sample-by document \
  --train-tokenizer "${VOCAB:-4096}" --out "$OUT/data" --overwrite
hgrn2 train --config tiny --set data="$OUT/data" out_dir="$OUT/run" max_steps="$STEPS" seq_len="$SEQ" \
  eval_every="$STEPS" save_every="$STEPS" "$@"
hgrn2 eval ppl "$OUT/run/final" "$OUT/data" --split val --sequences stream --length $((SEQ * 8)) \
  --train-length "$SEQ" --bin $((SEQ / 2)) --max-sequences "${SEQUENCES:-128}" --out "$OUT/ppl" "${RECORD[@]}"
LENGTHS=""  # context lengths from half to 8x SEQ_LEN, at least 128 (room for needle, question and haystack)
for ((n = SEQ / 2; n <= SEQ * 8; n *= 2)); do ((n < 128)) || LENGTHS="${LENGTHS:+$LENGTHS,}$n"; done
find "$OUT/corpus/valid" -name '*.txt' | sort | head -n 50 | xargs awk 'FNR == 1 && NR > 1 {print ""} 1' > "$OUT/haystack.txt"
hgrn2 eval needle "$OUT/run/final" --haystack "$OUT/haystack.txt" --mode "${NEEDLE_MODE:-passkey}" \
  --lengths "$LENGTHS" --depths 5 --trials "${TRIALS:-1}" --out "$OUT/needle" "${RECORD[@]}"
