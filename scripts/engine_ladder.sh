#!/usr/bin/env bash
# The precision ladder beside llama.cpp: for each precision the engine offers, the app's default drafter against
# plain decoding and llama.cpp on the same GGUF, prompts and budget, per domain (docs/engine.md). Needs the optional
# llama-cpp-python (bash scripts/install_llamacpp.sh).
# Usage: bash scripts/engine_ladder.sh OUT_DIR [LIMIT] [PRECISION ...]
#   (default: q4 q4-python bf16 fp32 fp32-transformers; q4-python is q4 without the native step, FLASHMAP_NATIVE=0)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: engine_ladder.sh OUT_DIR [LIMIT]}
limit=${2:-4}
shift $(( $# > 2 ? 2 : $# ))
names=("${@:-}")
[ -n "${names[0]}" ] || names=(q4 q4-python bf16 fp32 fp32-transformers)
mkdir -p "$out"
declare -A precisions=(
  [q4]="--quant q4"
  [q4-python]="--quant q4"
  [bf16]="--quant none --dtype bf16"
  [fp32]="--quant none --dtype fp32"
  [fp32-transformers]="--quant none --dtype fp32 --engine transformers"
)
for name in "${names[@]}"; do
  for domain in math code chat; do
    native=1
    [ "$name" = q4-python ] && native=0
    # shellcheck disable=SC2086
    FLASHMAP_NATIVE=$native .venv/bin/python -m app.bench --prompts "eval_$domain" --limit "$limit" \
      --drafter default --vs llama.cpp ${precisions[$name]} --out "$out/$name-$domain.json" > /dev/null
  done
done
