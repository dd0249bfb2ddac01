#!/usr/bin/env bash
# Reproduce the drafters for the embedded default (SmolLM2-135M-Instruct) from scratch, on the CPU.
# Every step resumes where it stopped: rerun the script in the next session to continue.
# Budget (identical data and steps for the FlashMap teacher and the DFlash-style baseline, issue #4):
#   LIMIT prompts per train_* file, STEPS optimiser steps (8 sequences x 16 anchors = 128 blocks each)
#   for the teacher and the baseline, DISTILL_STEPS for the flow map on top of the teacher.
# The teacher and the baseline train side by side, one thread each (two 2-thread jobs on 2 cores
# fight over them); jemalloc, when installed (apt-get install libjemalloc2), cuts allocator time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LIMIT=${LIMIT:-384}
STEPS=${STEPS:-1500}
DISTILL_STEPS=${DISTILL_STEPS:-800}
DATA=data/smollm2-responses
W=weights/smollm2-135m-instruct
LAYERS="1 10 20 29"  # spread_layers(30, 4): what `drafter.train` picks for this target
JEMALLOC=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
[ -f "$JEMALLOC" ] && export LD_PRELOAD=$JEMALLOC
export OMP_NUM_THREADS=1

$PY -m drafter.data generate --prompts ../shared/data/prompts/train_math.jsonl \
    ../shared/data/prompts/train_code.jsonl ../shared/data/prompts/train_chat.jsonl \
    --limit "$LIMIT" --shard-size 64 --batch-size 16 --max-new-tokens 256 --out "$DATA"
OMP_NUM_THREADS=2 $PY -m drafter.data features --data "$DATA" --layers $LAYERS  # ~1.4 GB cache, not committed
$PY -m drafter.train --stage teacher --data "$DATA" --out "$W/flashmap-teacher" --steps "$STEPS" --threads 1 &
TEACHER=$!
$PY -m drafter.train --stage dflash --data "$DATA" --out "$W/dflash" --steps "$STEPS" --threads 1 &
wait "$!" && wait "$TEACHER"  # either failing stops the script
OMP_NUM_THREADS=2 $PY -m drafter.train --stage distill --init "$W/flashmap-teacher" --data "$DATA" --out "$W/flashmap" \
    --steps "$DISTILL_STEPS" --lr 1e-4 --threads 2
