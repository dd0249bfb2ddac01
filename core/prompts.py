"""Prompt files: JSONL, one object per line with a `prompt` field (the first user message), and what each shipped set
may be used for.

The shipped sets live in data/prompts/ (SOURCES.md says where each comes from), so a name finds them from any working
directory. Every shipped set has one role (ROLES):
- training: drafters, the phrasebook and its calibration are built from it (the target writes the replies);
- tuning: it chose a setting, or settings were chosen while measuring on it, so a figure on it is not a held-out one;
- held-out: read only to report (the bench, the suite, the fidelity check). Training, calibration, the phrasebook
  build and every tuning comparison refuse it (refuse_held_out): by the file's name, and by its prompts wherever the
  file was copied to.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "prompts"


def read_jsonl(path) -> list[dict]:
    # split on "\n" only: str.splitlines() would also split inside strings at U+2028 and friends
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").split("\n") if line.strip()]


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.jsonl"))


TRAINING, TUNING, HELD_OUT = "training", "tuning", "held-out"
ROLES = {
    "train_math": TRAINING, "train_code": TRAINING, "train_chat": TRAINING, "magpie_train": TRAINING,
    # the public benchmarks every setting up to 0.46.0 was measured against
    "eval_math": TUNING, "eval_code": TUNING, "eval_chat": TUNING,
    # written as a fresh check (0.37.0), then used to choose the copies' patience and the phrasebook's size and grades
    "tuning_math": TUNING, "tuning_code": TUNING, "tuning_chat": TUNING,
    "magpie_check": TUNING,  # the phrasebook's grades are calibrated on its replies
    "heldout_math": HELD_OUT, "heldout_code": HELD_OUT, "heldout_chat": HELD_OUT,
}


class HeldOutError(ValueError):
    """A held-out set was given to something that trains, calibrates, builds or tunes."""


def role_of(name: str) -> str | None:
    """A shipped set's role by its name (`eval_math`, `data/prompts/eval_math.jsonl`), None for other files."""
    return ROLES.get(Path(name).name.removesuffix(".jsonl"))


def held_out_prompts() -> frozenset[str]:
    """Every prompt of the shipped held-out sets."""
    return frozenset(row["prompt"] for name, role in ROLES.items() if role == HELD_OUT
                     for row in read_jsonl(SHIPPED / f"{name}.jsonl"))


def refuse_held_out(names, use: str) -> None:
    """Raise HeldOutError when any of the prompt files `names` is a held-out set, by name or by holding one of its
    prompts; `use` says what was about to read them ("training", "calibration", "a tuning comparison", ...)."""
    held = None
    for name in names:
        if role_of(name) == HELD_OUT:
            raise HeldOutError(f"{name} is a held-out set: it is never used for {use} (core.prompts.ROLES)")
        path = Path(name)
        if not path.is_file():
            continue
        held = held_out_prompts() if held is None else held
        if any(row.get("prompt") in held for row in read_jsonl(path)):
            raise HeldOutError(f"{name} holds prompts of a held-out set: it is never used for {use}")


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


def word_ngrams(text: str, n: int = 3) -> frozenset[tuple[str, ...]]:
    """The text's lower-cased word n-grams (words: runs of letters, digits and underscores)."""
    words = re.findall(r"\w+", text.lower())
    return frozenset(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def near_duplicates(texts: list[str], others: list[str], threshold: float = 0.6, inside: bool = False,
                    n: int = 3) -> list[tuple[int, int, float]]:
    """(i, j, similarity) for every pair whose similarity of word n-grams is at least `threshold`: the Jaccard index of
    texts[i] and others[j], or with `inside` the share of texts[i]'s n-grams found in others[j] (a prompt quoted in a
    longer reply). A text under n words compares as its one shorter n-gram."""
    def grams(text):
        return word_ngrams(text, n) or word_ngrams(text, max(1, len(re.findall(r"\w+", text))))

    other_grams = [grams(text) for text in others]
    index: dict[tuple[str, ...], list[int]] = {}  # n-gram -> the others holding it
    for j, held in enumerate(other_grams):
        for gram in held:
            index.setdefault(gram, []).append(j)
    found = []
    for i, text in enumerate(texts):
        mine = grams(text)
        shared: dict[int, int] = {}  # other -> n-grams in common
        for gram in mine:
            for j in index.get(gram, ()):
                shared[j] = shared.get(j, 0) + 1
        for j, both in shared.items():
            similarity = both / len(mine) if inside else both / len(mine | other_grams[j])
            if similarity >= threshold:
                found.append((i, j, round(similarity, 3)))
    return found
