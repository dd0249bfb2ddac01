#!/usr/bin/env bash
# The README's test command: set up .venv, lint (ruff) and type-check (mypy over core/, drafter/ and app/; settings in
# pyproject.toml), then run every test (fast tiny-model tests and the slower ones on the embedded default). Pass pytest
# flags through, e.g. `-m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
