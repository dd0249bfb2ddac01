#!/usr/bin/env bash
# Every bench run behind docs/benchmarks.md, then the report itself. Runs alone on the machine
# (two torch jobs on 2 cores slow each other several-fold). Each run is skipped when its JSON exists;
# delete docs/results/<name>.json to redo it.
#   LIMIT prompts per eval file for the main runs, SWEEP_LIMIT / SHUFFLE_LIMIT for the others.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
# defaults = what docs/benchmarks.md was made with
LIMIT=${LIMIT:-4}
SWEEP_LIMIT=${SWEEP_LIMIT:-1}
SHUFFLE_LIMIT=${SHUFFLE_LIMIT:-1}
# optional: the checkpoints before training phase 2, from git history, to show what phase 2 bought:
#   for X in dflash flashmap; do mkdir -p runs/phase1/$X; for F in config.json model.safetensors; do
#     git show 98e80ee:weights/smollm2-135m-instruct/$X/$F > runs/phase1/$X/$F; done; done
PHASE1=${PHASE1:-runs/phase1}
SHORT_TOKENS=${SHORT_TOKENS:-96}  # new tokens for the K sweep and the shuffle test
P=data/prompts
R=docs/results
mkdir -p "$R"
run() { local name=$1; shift; [ -f "$R/$name.json" ] || $PY -m app.suite "$@" --out "$R/$name.json"; }

[ -f "$R/verify_cost.json" ] || $PY -m core.verify_cost --positions $(seq 1 17) --out "$R/verify_cost.json"
[ -f "$R/verify_cost_bf16.json" ] || $PY -m core.verify_cost --positions $(seq 1 17) --dtype bf16 \
  --out "$R/verify_cost_bf16.json"
for T in 0 1; do
  for D in math code chat; do
    run "main_${D}_t$T" --prompts "$P/eval_$D.jsonl" --limit "$LIMIT" --temperature "$T" --block-size 16 \
      --variants ngram hf-prompt-lookup dflash flashmap,steps=1 flashmap,steps=2 flashmap,steps=1,adaptive=1,skip=0 \
      flashmap,steps=1,adaptive=1
  done
done
# multi-sample drafting with tree verification (App. D), T=0: K=16 as in the paper, and the small trees that
# suit a CPU, where 17 positions cost ~1.9x one; the app's default chat setting (K=8, adaptive) for reference
for D in math code chat; do
  run "tree_${D}_t0" --prompts "$P/eval_$D.jsonl" --limit "$LIMIT" --temperature 0 --block-size 16 \
    --variants flashmap flashmap,tree=4 flashmap,k=4 flashmap,tree=4,k=4 flashmap,k=8,adaptive=1 flashmap,tree=4,k=8
done
SWEEP=()
for K in 2 4 8 16; do SWEEP+=(dflash,k=$K flashmap,steps=1,k=$K flashmap,steps=2,k=$K); done
run ksweep_t0 --prompts "$P/eval_math.jsonl" "$P/eval_code.jsonl" "$P/eval_chat.jsonl" --limit "$SWEEP_LIMIT" \
  --temperature 0 --max-new-tokens "$SHORT_TOKENS" --variants "${SWEEP[@]}"
run shuffle_t0 --prompts "$P/eval_math.jsonl" "$P/eval_code.jsonl" "$P/eval_chat.jsonl" --limit "$SHUFFLE_LIMIT" \
  --temperature 0 --max-new-tokens "$SHORT_TOKENS" --block-size 16 --variants flashmap-teacher,steps=16 flashmap-teacher,steps=16,noise=shuffled \
  flashmap,steps=1 flashmap,steps=1,noise=shuffled flashmap,steps=2 flashmap,steps=2,noise=shuffled
# acceptance offline on held-out responses (data/smollm2-val; scripts/train_embedded.sh writes it and its
# feature cache) and on trained-on ones, paired across drafters. Per-slot independent noise costs K draws
# per block and the teacher 16 passes per draft, so those run on every 16th anchor instead of every 2nd.
off() { local name=$1; shift; [ -f "$R/$name.json" ] || $PY -m drafter.evaluate "$@" --out "$R/$name.json"; }
off offline_val --data data/smollm2-val --stride 2 --variants dflash flashmap flashmap,steps=2
off offline_val_sparse --data data/smollm2-val --stride 16 --variants dflash flashmap flashmap,noise=shuffled \
  flashmap,steps=2 flashmap,steps=2,noise=shuffled flashmap,best_of=4 flashmap-teacher,steps=16 \
  flashmap-teacher,steps=16,scale=0.3 flashmap-teacher,steps=1
off offline_tree --data data/smollm2-val --stride 2 --variants dflash flashmap flashmap,tree=2 flashmap,tree=4 \
  flashmap,tree=8 flashmap,steps=2 flashmap,steps=2,tree=4
off offline_tree_k4 --data data/smollm2-val --stride 2 --block-size 4 --variants dflash flashmap flashmap,tree=4 flashmap,steps=2 \
  flashmap,steps=2,tree=4
off offline_seen --data data/smollm2-responses --limit 32 --stride 2 --variants dflash flashmap flashmap,steps=2
if [ -d "$PHASE1" ]; then  # the checkpoints before training phase 2, for what it bought
  off offline_val_phase1 --data data/smollm2-val --stride 2 --variants "dflash,weights=$PHASE1/dflash" \
    "flashmap,weights=$PHASE1/flashmap" "flashmap,steps=2,weights=$PHASE1/flashmap"
fi
# version 0.9: both CPU linear kernels side by side, and the app's defaults in the engine with oneDNN (the default)
[ -f "$R/verify_cost_kernels.json" ] || $PY -m core.verify_cost --compare-cpu-linear --repeats 20 \
  --out "$R/verify_cost_kernels.json"
E=(--max-new-tokens 96 --prompts eval_math eval_code)
run defaults17_t0 "${E[@]}" eval_chat --limit 3 --variants flashmap,scale=0,adaptive=1 \
  flashmap,steps=2,scale=0,adaptive=1 dflash,adaptive=1 flashmap,scale=0
run defaults17_t0_rerun "${E[@]}" --limit 5 --variants flashmap,scale=0,adaptive=1
run defaults17_t1 "${E[@]}" eval_chat --limit 3 --temperature 1 --variants flashmap,adaptive=1 \
  flashmap,scale=0,adaptive=1 dflash,adaptive=1
# version 0.10: the adaptive policy now (calibrated confidence, drafts charged for the drafter's call) against before
ab() { local name=$1; shift; [ -f "$R/$name.json" ] || $PY -m scripts.policy_ab "$@" --out "$R/$name.json"; }
ab policy_ab_t0 --prompts eval_math eval_code eval_chat --limit 4 --max-new-tokens 96 \
  --drafters flashmap,scale=0 dflash --arms new before
ab policy_ab_2step_t0 --prompts eval_math eval_code eval_chat --limit 4 --max-new-tokens 96 \
  --drafters flashmap,steps=2,scale=0 --arms new before calibrated charged
# T = 1 measured at commit e49702e, when the skips charged the drafter at every temperature (since then T > 0 charges
# nothing, GenerationConfig.charges_draft_cost, so on later commits both arms run alike)
ab policy_ab_t1 --prompts eval_math eval_code eval_chat --limit 4 --max-new-tokens 96 --temperature 1 \
  --drafters flashmap --arms new before
# versions 0.11 on: the app's defaults in the engine with the shipped flow map against the one it replaced, kept with its
# own calibration.json in a folder (git show COMMIT:weights/smollm2-135m-instruct/flashmap/FILE), T = 0 and T = 1;
# skipped when the folder is missing. vs_prev NAME DIR [more T = 0 variants]
VS=(--max-new-tokens 96 --prompts eval_math eval_code eval_chat --limit 4)
vs_prev() {
  local name=$1 prev=$2; shift 2
  [ -d "$prev" ] || return 0
  run "${name}_t0" "${VS[@]}" --variants flashmap,scale=0,adaptive=1 "flashmap,scale=0,adaptive=1,weights=$prev" "$@"
  run "${name}_t1" "${VS[@]}" --temperature 1 --variants flashmap,adaptive=1 "flashmap,adaptive=1,weights=$prev"
}
# version 0.11: distilled from the teacher trained on all three response sets, against version 0.10's (2aeb217)
vs_prev defaults18 "${PREV:-runs/prev10/flashmap}" flashmap,steps=2,scale=0,adaptive=1 dflash,adaptive=1
# version 0.12: distilled with the noise path (--noise-path-blocks), against version 0.11's (e9ea232)
vs_prev defaults19 "${PREV11:-runs/prev11/flashmap}"
# version 0.14: distilled from the teacher trained on the chat follow-ups too, against version 0.12's (7c703d9)
PREV12=${PREV12:-runs/prev12/flashmap}
vs_prev defaults20 "$PREV12" flashmap,steps=2,scale=0,adaptive=1
# and at T = 1 its draft from noise (the app's) against from x0 = 0, beside version 0.12's
if [ -d "$PREV12" ]; then
  run defaults20_t1_zero "${VS[@]}" --temperature 1 \
    --variants flashmap,adaptive=1 flashmap,scale=0,adaptive=1 "flashmap,adaptive=1,weights=$PREV12"
fi
# version 0.16: distilled at full length from version 0.14's teacher (the shipped one), against version 0.14's (681cb5b)
vs_prev defaults21 "${PREV14:-runs/prev14/flashmap}" flashmap,steps=2,scale=0,adaptive=1
$PY -m scripts.report
