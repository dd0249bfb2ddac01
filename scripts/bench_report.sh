#!/usr/bin/env bash
# Every bench run behind docs/benchmarks.md, then the report itself. Runs alone on the machine
# (two torch jobs on 2 cores slow each other several-fold). Each run is skipped when its JSON exists;
# delete docs/results/<name>.json to redo it.
#   LIMIT prompts per eval file for the main runs, SWEEP_LIMIT / SHUFFLE_LIMIT for the others.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LIMIT=${LIMIT:-20}
SWEEP_LIMIT=${SWEEP_LIMIT:-4}
SHUFFLE_LIMIT=${SHUFFLE_LIMIT:-6}
P=../shared/data/prompts
R=docs/results
mkdir -p "$R"
run() { local name=$1; shift; [ -f "$R/$name.json" ] || $PY -m app.suite "$@" --out "$R/$name.json"; }

[ -f "$R/verify_cost.json" ] || $PY -m app.verify_cost --positions $(seq 1 17) --out "$R/verify_cost.json"
for T in 0 1; do
  for D in math code chat; do
    run "main_${D}_t$T" --prompts "$P/eval_$D.jsonl" --limit "$LIMIT" --temperature "$T" --block-size 16 \
      --variants ngram hf-prompt-lookup dflash flashmap,steps=1 flashmap,steps=2
  done
done
SWEEP=()
for K in 2 4 8 12 16; do SWEEP+=(dflash,k=$K flashmap,steps=1,k=$K flashmap,steps=2,k=$K); done
run ksweep_t0 --prompts "$P/eval_math.jsonl" "$P/eval_code.jsonl" "$P/eval_chat.jsonl" --limit "$SWEEP_LIMIT" \
  --temperature 0 --variants "${SWEEP[@]}"
run shuffle_t0 --prompts "$P/eval_math.jsonl" "$P/eval_code.jsonl" "$P/eval_chat.jsonl" --limit "$SHUFFLE_LIMIT" \
  --temperature 0 --block-size 16 --variants flashmap-teacher,steps=16 flashmap-teacher,steps=16,noise=shuffled \
  flashmap,steps=1 flashmap,steps=1,noise=shuffled flashmap,steps=2 flashmap,steps=2,noise=shuffled
$PY scripts/report.py
