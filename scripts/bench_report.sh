#!/usr/bin/env bash
# Every bench run behind docs/benchmarks.md, then the report itself. Runs alone on the machine
# (two torch jobs on 2 cores slow each other several-fold). Each run is skipped when its JSON exists;
# delete docs/results/<name>.json to redo it.
#   LIMIT prompts per eval file for the main runs, SWEEP_LIMIT / SHUFFLE_LIMIT for the others.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
# defaults = what docs/benchmarks.md was made with (2026-11-29, ~75 minutes of a 2-core CPU in all)
LIMIT=${LIMIT:-4}
SWEEP_LIMIT=${SWEEP_LIMIT:-1}
SHUFFLE_LIMIT=${SHUFFLE_LIMIT:-1}
FIT_LIMIT=${FIT_LIMIT:-2}
LONG=${LONG:-runs/dflash-3000}  # the DFlash-style baseline trained on to 3,000 steps (not shipped)
SHORT_TOKENS=${SHORT_TOKENS:-96}  # new tokens for the K sweep and the shuffle test
P=../shared/data/prompts
R=docs/results
mkdir -p "$R"
run() { local name=$1; shift; [ -f "$R/$name.json" ] || $PY -m app.suite "$@" --out "$R/$name.json"; }

[ -f "$R/verify_cost.json" ] || $PY -m app.verify_cost --positions $(seq 1 17) --out "$R/verify_cost.json"
[ -f "$R/verify_cost_bf16.json" ] || $PY -m app.verify_cost --positions $(seq 1 17) --dtype bf16 \
  --out "$R/verify_cost_bf16.json"
for T in 0 1; do
  for D in math code chat; do
    run "main_${D}_t$T" --prompts "$P/eval_$D.jsonl" --limit "$LIMIT" --temperature "$T" --block-size 16 \
      --variants ngram hf-prompt-lookup dflash flashmap,steps=1 flashmap,steps=2 flashmap,steps=1,adaptive=1
  done
done
SWEEP=()
for K in 2 4 8 16; do SWEEP+=(dflash,k=$K flashmap,steps=1,k=$K flashmap,steps=2,k=$K); done
run ksweep_t0 --prompts "$P/eval_math.jsonl" "$P/eval_code.jsonl" "$P/eval_chat.jsonl" --limit "$SWEEP_LIMIT" \
  --temperature 0 --max-new-tokens "$SHORT_TOKENS" --variants "${SWEEP[@]}"
run shuffle_t0 --prompts "$P/eval_math.jsonl" "$P/eval_code.jsonl" "$P/eval_chat.jsonl" --limit "$SHUFFLE_LIMIT" \
  --temperature 0 --max-new-tokens "$SHORT_TOKENS" --block-size 16 --variants flashmap-teacher,steps=16 flashmap-teacher,steps=16,noise=shuffled \
  flashmap,steps=1 flashmap,steps=1,noise=shuffled flashmap,steps=2 flashmap,steps=2,noise=shuffled
if [ ! -f "$R/fit_train.json" ]; then  # seen vs held-out prompts, and what twice the steps buys
  [ -f "$LONG/config.json" ] || { mkdir -p "$LONG" && cp weights/smollm2-135m-instruct/dflash/* "$LONG/"; }
  OMP_NUM_THREADS=1 $PY -m drafter.train --stage dflash --data data/smollm2-responses --out "$LONG" --steps 3000 --threads 1
  for SET in eval train; do
    run "fit_$SET" --prompts "$P/${SET}_math.jsonl" "$P/${SET}_code.jsonl" "$P/${SET}_chat.jsonl" --limit "$FIT_LIMIT" \
      --temperature 0 --max-new-tokens "$SHORT_TOKENS" --variants dflash "dflash,weights=$LONG" flashmap,steps=1
  done
fi
$PY scripts/report.py
