#!/usr/bin/env bash
# Drafters in the published DFlash layout for the embedded default (SmolLM2-135M-Instruct), trained on the CPU and
# exportable with `python -m drafter.export` to every engine that serves DFlash (docs/serving.md).
# Stage 1 (this script): the DFlash-style drafter on the z-lab backbone, open-ended (`drafter.loop`), its held-out
# acceptance measured every EVAL_EVERY steps and the best kept in $OUT/dflash/best. Every step resumes: rerun to
# continue. The FlashMap on the same backbone is then warm-started from it (`--stage teacher --init
# $OUT/dflash/best --t0-share 0.3`, then `--stage distill`), as the shipped DiT drafters were.
# Shape: 2 layers at the target's width (576, 9 heads / 3 KV heads of 64), block 16 (anchor + 15), the target's
# layers 1, 10, 20, 29 as features, the last 128 positions as context, the scale-gate time modulation (foldable).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
HOURS=${HOURS:-2}
OUT=${OUT:-runs/zlab}
EVAL_EVERY=${EVAL_EVERY:-200}
DATA="data/smollm2-responses data/smollm2-responses-2"
VAL=data/smollm2-val
export OMP_NUM_THREADS=1
for d in $VAL $DATA; do  # feature caches (~1.2 MB a response, not committed)
  [ -d "$d/features-1-10-20-29" ] || $PY -m drafter.data features --layers 1 10 20 29 --data "$d"
done
$PY -m drafter.loop --stage dflash --backbone zlab --modulation scale-gate --n-layers 2 --block-size 15 \
    --n-feature-layers 4 --context-window 128 --data $DATA --val $VAL --out "$OUT/dflash" \
    --curve docs/results/curves/zlab-dflash.jsonl --lr 6e-4 --batch-seqs 4 --anchors-per-seq 8 \
    --save-every 50 --eval-every "$EVAL_EVERY" --stride 16 --threads 1 --precision fp32 --hours "$HOURS"
