"""Prompt files: JSONL, one object per line with a `prompt` field (the first user message).

The evaluation sets ship in data/prompts/ (eval_math, eval_code, eval_chat), so a name finds them
from any working directory."""
from __future__ import annotations

import json
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "prompts"


def read_jsonl(path) -> list[dict]:
    # split on "\n" only: str.splitlines() would also split inside strings at U+2028 and friends
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").split("\n") if line.strip()]


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.jsonl"))


def resolve_prompt_file(name: str) -> Path:
    """A path as given when it exists, else a shipped set by name (`eval_math` or `eval_math.jsonl`)."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = SHIPPED / (path.name if path.suffix == ".jsonl" else f"{path.name}.jsonl")
    if shipped.is_file():
        return shipped
    raise FileNotFoundError(f"no prompt file {name!r}: give a JSONL path or one of the shipped sets "
                            f"({', '.join(shipped_names())})")


def read_prompt_file(name: str) -> list[dict]:
    return read_jsonl(resolve_prompt_file(name))
