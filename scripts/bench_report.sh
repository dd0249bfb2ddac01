#!/usr/bin/env bash
# Every bench run behind docs/benchmarks.md, then the report itself. Runs alone on the machine
# (two torch jobs on 2 cores slow each other several-fold). Each run is written as docs/results/NAME-DATE.json
# (DATE: today unless set) and skipped when that file exists, so an interrupted report resumes; the report reads the
# newest DATE of each NAME. The engine's own ladder against llama.cpp is scripts/engine_ladder.sh (docs/engine.md).
#   LIMIT prompts per eval file for the main runs, SWEEP_LIMIT / SHUFFLE_LIMIT for the others.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
# defaults = what docs/benchmarks.md was made with
LIMIT=${LIMIT:-4}
SWEEP_LIMIT=${SWEEP_LIMIT:-1}
SHUFFLE_LIMIT=${SHUFFLE_LIMIT:-1}
SHORT_TOKENS=${SHORT_TOKENS:-96}  # new tokens for the K sweep and the shuffle test
DATE=${DATE:-$(date +%F)}
P=data/prompts
R=docs/results
mkdir -p "$R"
run() { local name=$1; shift; [ -f "$R/$name-$DATE.json" ] || $PY -m app.suite "$@" --out "$R/$name-$DATE.json"; }

for T in 0 1; do
  for D in math code chat; do
    run "drafters-$D-t$T" --prompts "$P/eval_$D.jsonl" --limit "$LIMIT" --temperature "$T" --block-size 16 \
      --variants ngram hf-prompt-lookup dflash flashmap,steps=1 flashmap,steps=2 flashmap,steps=1,adaptive=1,skip=0 \
      flashmap,steps=1,adaptive=1
  done
done
# multi-sample drafting with tree verification (App. D), T=0: K=16 as in the paper, and the small trees that
# suit a CPU; the app's default chat setting (K=8, adaptive) for reference
for D in math code chat; do
  run "tree-$D-t0" --prompts "$P/eval_$D.jsonl" --limit "$LIMIT" --temperature 0 --block-size 16 \
    --variants flashmap flashmap,tree=4 flashmap,k=4 flashmap,tree=4,k=4 flashmap,k=8,adaptive=1 flashmap,tree=4,k=8
done
SWEEP=()
for K in 2 4 8 16; do SWEEP+=(dflash,k=$K flashmap,steps=1,k=$K flashmap,steps=2,k=$K); done
run k-sweep-t0 --prompts "$P/eval_math.jsonl" "$P/eval_code.jsonl" "$P/eval_chat.jsonl" --limit "$SWEEP_LIMIT" \
  --temperature 0 --max-new-tokens "$SHORT_TOKENS" --variants "${SWEEP[@]}"
run shuffle-test-t0 --prompts "$P/eval_math.jsonl" "$P/eval_code.jsonl" "$P/eval_chat.jsonl" \
  --limit "$SHUFFLE_LIMIT" --temperature 0 --max-new-tokens "$SHORT_TOKENS" --block-size 16 \
  --variants flashmap-teacher,steps=16 flashmap-teacher,steps=16,noise=shuffled flashmap,steps=1 \
  flashmap,steps=1,noise=shuffled flashmap,steps=2 flashmap,steps=2,noise=shuffled
# acceptance offline on held-out responses (data/smollm2-val; scripts/train_embedded.sh writes it and its
# feature cache) and on trained-on ones, paired across drafters. Per-slot independent noise costs K draws
# per block and the teacher 16 passes per draft, so those run on every 16th anchor instead of every 2nd.
off() { local name=$1; shift; [ -f "$R/$name-$DATE.json" ] || $PY -m drafter.evaluation.evaluate "$@" --out "$R/$name-$DATE.json"; }
off offline-val-stride2 --data data/smollm2-val --stride 2 --variants dflash flashmap flashmap,steps=2
off offline-val-stride16 --data data/smollm2-val --stride 16 --variants dflash flashmap flashmap,noise=shuffled \
  flashmap,steps=2 flashmap,steps=2,noise=shuffled flashmap,best_of=4 flashmap-teacher,steps=16 \
  flashmap-teacher,steps=16,scale=0.3 flashmap-teacher,steps=1
off offline-tree --data data/smollm2-val --stride 2 --variants dflash flashmap flashmap,tree=2 flashmap,tree=4 \
  flashmap,tree=8 flashmap,steps=2 flashmap,steps=2,tree=4
off offline-tree-k4 --data data/smollm2-val --stride 2 --block-size 4 --variants dflash flashmap flashmap,tree=4 \
  flashmap,steps=2 flashmap,steps=2,tree=4
off offline-seen --data data/smollm2-responses --limit 32 --stride 2 --variants dflash flashmap flashmap,steps=2
# the shipped drafters' acceptance targets and the 2-step shuffle test, paired on the same anchors
off offline-acceptance-stride16 --data data/smollm2-val --stride 16 --variants dflash flashmap,scale=0 flashmap \
  flashmap,steps=2,scale=0 flashmap,steps=2 flashmap,steps=2,noise=shuffled flashmap-teacher \
  flashmap-teacher,steps=16,scale=0
off offline-walk --data data/smollm2-val --walk --variants flashmap,scale=0 flashmap,steps=2,scale=0 dflash
# the adaptive policy (calibrated confidence, drafts charged for the drafter's call) against the one before it
ab() { local name=$1; shift; [ -f "$R/$name-$DATE.json" ] || $PY -m lab.policy_ab "$@" --out "$R/$name-$DATE.json"; }
ab policy-ab-t0 --prompts eval_math eval_code eval_chat --limit 4 --max-new-tokens 96 \
  --drafters flashmap,scale=0 dflash --arms new before
ab policy-ab-2step-t0 --prompts eval_math eval_code eval_chat --limit 4 --max-new-tokens 96 \
  --drafters flashmap,steps=2,scale=0 --arms new before calibrated charged
ab policy-ab-t1 --prompts eval_math eval_code eval_chat --limit 4 --max-new-tokens 96 --temperature 1 \
  --drafters flashmap --arms new before
$PY -m scripts.report
