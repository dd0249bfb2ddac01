#!/usr/bin/env bash
# Reproduce the drafters for the embedded default (SmolLM2-135M-Instruct) from scratch, on the CPU.
# Every step resumes where it stopped: rerun the script in the next session to continue.
# Budget knobs (identical for the FlashMap teacher and the DFlash-style baseline, as issue #4 asks):
#   LIMIT prompts per train_* file, STEPS optimiser steps per stage, DISTILL_STEPS for the flow map.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LIMIT=${LIMIT:-384}
STEPS=${STEPS:-3000}
DISTILL_STEPS=${DISTILL_STEPS:-1500}
DATA=data/smollm2-responses
W=weights/smollm2-135m-instruct
LAYERS="1 10 20 29"  # spread_layers(30, 4): what `drafter.train` picks for this target

$PY -m drafter.data generate --prompts ../shared/data/prompts/train_math.jsonl \
    ../shared/data/prompts/train_code.jsonl ../shared/data/prompts/train_chat.jsonl \
    --limit "$LIMIT" --shard-size 64 --batch-size 16 --max-new-tokens 256 --out "$DATA"
$PY -m drafter.data features --data "$DATA" --layers $LAYERS   # cache, ~4.6 KB per token, not committed
$PY -m drafter.train --stage teacher --data "$DATA" --out "$W/flashmap-teacher" --steps "$STEPS"
$PY -m drafter.train --stage dflash --data "$DATA" --out "$W/dflash" --steps "$STEPS"
$PY -m drafter.train --stage distill --init "$W/flashmap-teacher" --data "$DATA" --out "$W/flashmap" \
    --steps "$DISTILL_STEPS"
