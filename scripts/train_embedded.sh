#!/usr/bin/env bash
# Reproduce the drafters for the embedded default (SmolLM2-135M-Instruct) from scratch, on the CPU.
# Every step resumes where it stopped: rerun the script in the next session to continue.
# Budget (identical data and steps for the FlashMap teacher and the DFlash-style baseline):
#   phase 1: LIMIT prompts per train_* file, STEPS optimiser steps (8 sequences x 16 anchors = 128 blocks
#   each) for the teacher and the baseline, DISTILL_STEPS for the flow map on top of the teacher;
#   phase 2: prompts VAL_END.. (LIMIT2 more per math/code file; chat has none left) pooled with phase 1's,
#   training continued to STEPS2 and DISTILL_STEPS2 (the cosine restarts part-way up: a warm restart).
#   Prompts LIMIT..VAL_END of every file are answered for validation only (python -m drafter.evaluation.evaluate).
# The teacher and the baseline train side by side, one thread each (two 2-thread jobs on 2 cores
# fight over them); jemalloc, when installed (apt-get install libjemalloc2), cuts allocator time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LIMIT=${LIMIT:-384}
STEPS=${STEPS:-1500}
DISTILL_STEPS=${DISTILL_STEPS:-800}
VAL_END=${VAL_END:-448}
LIMIT2=${LIMIT2:-320}
STEPS2=${STEPS2:-2700}
DISTILL_STEPS2=${DISTILL_STEPS2:-1400}
P=data/prompts
DATA=data/smollm2-responses
DATA2=data/smollm2-responses-2
VAL=data/smollm2-val
W=weights/smollm2-135m-instruct
LAYERS="1 10 20 29"  # spread_layers(30, 4): what `drafter.training.train` picks for this target
JEMALLOC=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
[ -f "$JEMALLOC" ] && export LD_PRELOAD=$JEMALLOC
export OMP_NUM_THREADS=1

gen() { OMP_NUM_THREADS=2 $PY -m drafter.data generate --shard-size 64 --batch-size 16 --max-new-tokens 256 "$@"; }
features() { OMP_NUM_THREADS=2 $PY -m drafter.data features --layers $LAYERS --data "$1"; }  # ~1.2 MB/response, not committed
pair() {  # teacher and baseline side by side, the same data and steps
  $PY -m drafter.training.train --stage teacher --out "$W/flashmap-teacher" --threads 1 "$@" &
  local teacher=$!
  $PY -m drafter.training.train --stage dflash --out "$W/dflash" --threads 1 "$@" &
  wait "$!" && wait "$teacher"  # either failing stops the script
}
distill() {
  OMP_NUM_THREADS=2 $PY -m drafter.training.train --stage distill --init "$W/flashmap-teacher" --out "$W/flashmap" \
      --lr 1e-4 --threads 2 "$@"
}

# the shipped flow teacher is phase 3's (below): once it is there, phases 1-2 must not resume it as theirs
phase3_done() { grep -q '"t0_share": 0.3' "$W/flashmap-teacher/config.json" 2>/dev/null; }

# phase 1
gen --prompts $P/train_math.jsonl $P/train_code.jsonl $P/train_chat.jsonl --limit "$LIMIT" --out "$DATA"
features "$DATA"
phase3_done || pair --data "$DATA" --steps "$STEPS"
phase3_done || distill --data "$DATA" --steps "$DISTILL_STEPS"
# validation responses (never trained on) and phase 2
gen --prompts $P/train_math.jsonl $P/train_code.jsonl $P/train_chat.jsonl --start "$LIMIT" \
    --limit $((VAL_END - LIMIT)) --out "$VAL"
features "$VAL"
gen --prompts $P/train_math.jsonl $P/train_code.jsonl --start "$VAL_END" --limit "$LIMIT2" --out "$DATA2"
features "$DATA2"
phase3_done || pair --data "$DATA" "$DATA2" --steps "$STEPS2"
phase3_done || distill --data "$DATA" "$DATA2" --steps "$DISTILL_STEPS2"
# phase 3: the teacher warm-started from the DFlash-style net with 30% of blocks at t = 0, then the flow
# map distilled from it starting from the phase-2 flow map (--student-init keeps the jumps it learned). Each in a
# fresh folder (an existing one would resume), which then replaces the shipped checkpoint.
WARM=runs/teacher-warm
STUDENT=runs/flashmap-phase3
if ! phase3_done; then
  OMP_NUM_THREADS=2 $PY -m drafter.training.train --stage teacher --init "$W/dflash" --t0-share 0.3 --lr 3e-4 --steps 800 \
      --threads 2 --save-every 100 --data "$DATA" "$DATA2" --out "$WARM"
  OMP_NUM_THREADS=2 $PY -m drafter.training.train --stage distill --init "$WARM" --student-init "$W/flashmap" --lr 5e-5 \
      --steps "${DISTILL_STEPS3:-3300}" --threads 2 --save-every 100 --data "$DATA" "$DATA2" --out "$STUDENT"
  cp "$STUDENT/model.safetensors" "$STUDENT/config.json" "$W/flashmap/"  # the teacher last: it marks phase 3 done
  cp "$WARM/model.safetensors" "$WARM/config.json" "$W/flashmap-teacher/"
fi
