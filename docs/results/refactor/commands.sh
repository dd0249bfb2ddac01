#!/usr/bin/env bash
# usage: baseline.sh OUTDIR  -- fingerprints for the refactor's no-behaviour-change check
cd ${ROOT:-/work/before}
O=$1; mkdir -p $O
P=data/prompts
export OMP_NUM_THREADS=1
PY=".venv/bin/python"
$PY -m drafter.evaluate --data data/smollm2-val --stride 16 --variants flashmap flashmap,steps=2 dflash flashmap,tree=4 \
   flashmap-teacher,steps=4 flashmap,best_of=2,noise=shuffled --out $O/eval.json > $O/eval.log 2>&1
$PY -m app.suite --prompts $P/eval_math.jsonl $P/eval_code.jsonl --limit 1 --variants ngram flashmap,k=8,adaptive=1 \
   flashmap,tree=4 dflash,k=8 flashmap,steps=2,noise=shuffled --max-new-tokens 48 --out $O/suite_t0.json > $O/suite.log 2>&1
$PY -m app.bench --prompts $P/eval_chat.jsonl --limit 2 --drafter flashmap --block-size 8 --temperature 1 \
   --max-new-tokens 48 --out $O/bench_t1.json > $O/bench.log 2>&1
echo DONE > $O/done
