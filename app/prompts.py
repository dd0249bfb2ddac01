"""Prompt files: JSONL, one object per line with a `prompt` field (the first user message)."""
from __future__ import annotations

import json
from pathlib import Path


def read_jsonl(path) -> list[dict]:
    # split on "\n" only: str.splitlines() would also split inside strings at U+2028 and friends
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").split("\n") if line.strip()]
