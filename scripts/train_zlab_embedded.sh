#!/usr/bin/env bash
# Drafters in the published DFlash layout for the embedded default (SmolLM2-135M-Instruct), trained on the CPU and
# exportable with `python -m drafter.formats.export` to every engine that serves DFlash (docs/serving.md).
# STAGE=dflash (default): the DFlash-style drafter on the z-lab backbone, open-ended (`drafter.training.loop`), its held-out
# acceptance measured every EVAL_EVERY steps and the best kept in $OUT/dflash/best.
# STAGE=teacher: the FlashMap flow teacher warm-started from $OUT/dflash/best (its t = 0 pass starts as DFlash-style's,
# 30% of blocks at t = 0), open-ended likewise; STAGE=distill: the flow map distilled from $OUT/teacher/best with the
# zero-noise jumps the app's T = 0 draft takes, one warmup-stable-decay cycle of DISTILL_STEPS. As the shipped DiT
# drafters were made. Every stage resumes: rerun the same command to continue.
# Shape: 2 layers at the target's width (576, 9 heads / 3 KV heads of 64), block 16 (anchor + 15), the target's
# layers 1, 10, 20, 29 as features, the last 128 positions as context, the scale-gate time modulation (foldable).
# --precision auto picks bf16 autocast here even without AMX: the step is mostly the full-vocabulary head (480 rows
# x 49,152), which AVX512-BF16 multiplies 4x faster than fp32; a step took 0.70 s against 1.69 s (2026-12-01).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
HOURS=${HOURS:-2}
OUT=${OUT:-weights/smollm2-135m-instruct/zlab}  # the latest checkpoints are committed there; best/ and moments are not
EVAL_EVERY=${EVAL_EVERY:-200}
DATA="data/smollm2-responses data/smollm2-responses-2"
VAL=data/smollm2-val
export OMP_NUM_THREADS=1
for d in $VAL $DATA; do  # feature caches (~1.2 MB a response, not committed)
  [ -d "$d/features-1-10-20-29" ] || $PY -m drafter.data features --layers 1 10 20 29 --data "$d"
done
STAGE=${STAGE:-dflash}
DISTILL_STEPS=${DISTILL_STEPS:-1200}
common=(--data $DATA --val $VAL --batch-seqs 4 --anchors-per-seq 8 --save-every 50 --eval-every "$EVAL_EVERY"
        --stride 16 --threads 1 --precision auto --hours "$HOURS")
case "$STAGE" in
  dflash)
    $PY -m drafter.training.loop --stage dflash --backbone zlab --modulation scale-gate --n-layers 2 --block-size 15 \
        --n-feature-layers 4 --context-window 128 --out "$OUT/dflash" --curve docs/results/curves/zlab-dflash.jsonl \
        --lr 6e-4 "${common[@]}" ;;
  teacher)
    init="$OUT/dflash/best"; [ -d "$init" ] || init="$OUT/dflash"
    $PY -m drafter.training.loop --stage teacher --init "$init" --t0-share 0.3 --out "$OUT/teacher" \
        --curve docs/results/curves/zlab-teacher.jsonl --lr 3e-4 "${common[@]}" ;;
  distill)
    init="$OUT/teacher/best"; [ -d "$init" ] || init="$OUT/teacher"
    $PY -m drafter.training.loop --stage distill --init "$init" --out "$OUT/flashmap" --cycle-steps "$DISTILL_STEPS" \
        --zero-noise-blocks 16 --zero-noise-path --eval-spec "flashmap,scale=0" \
        --curve docs/results/curves/zlab-flashmap.jsonl --lr 1e-4 "${common[@]}" ;;
  *) echo "STAGE must be dflash, teacher or distill" >&2; exit 2 ;;
esac
