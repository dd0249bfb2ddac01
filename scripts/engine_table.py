"""docs/journal/engine.md's tables: the precision ladder from scripts/engine_ladder.sh's JSON files, and the app's
default per prompt set, domain and temperature from `python -m app.bench ... --drafter default` files named
SET-DOMAIN-tT.json.

python -m scripts.engine_table DIR
python -m scripts.engine_table --cells DIR [DIR ...]    (a cell from the first folder that holds it)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from core.drafting.base import COPIED  # the free sources' rounds (core.drafting.base.Draft.source)

ORDER = ("q4", "q4-python", "bf16", "fp32", "fp32-transformers")
DOMAINS = ("math", "code", "chat")


def row(path: Path, domain: str) -> str:
    d = json.loads(path.read_text())
    anchor = d["llama_cpp"]
    return (f"| {domain} | {d['precision']} | {d['threads']} | {anchor['tokens_per_s']:.1f} | "
            f"{d['baseline_tokens_per_s']:.1f} ({anchor['plain_vs_llama_cpp']:.2f}) | {d['tokens_per_s']:.1f} "
            f"({anchor['drafter_vs_llama_cpp']:.2f}) | {d['speedup']:.2f}× | {d['acceptance_length']:.2f} | "
            f"{'yes' if d['identical_to_baseline'] else 'NO'} |")


def cell(path: Path) -> str:
    """One bench summary as `speedup ± se (τ; copied / drafted / plain rounds)`, bold at >= 1.2x."""
    d = json.loads(path.read_text())
    rounds = d["rounds_by_source"]
    copied = sum(n for source, n in rounds.items() if source.split()[0] in COPIED)
    ratio = f"{d['speedup']:.2f}× ± {d['speedup_se']:.2f}"
    ratio = f"**{ratio}**" if d["speedup"] >= 1.2 else ratio
    same = "" if d["temperature"] > 0 or d["identical_to_baseline"] else ", NOT identical"
    return (f"{ratio} (τ {d['acceptance_length']:.2f}; {copied:,} / {rounds.get('drafter', 0):,} / "
            f"{rounds.get('plain', 0):,}{same})")


def first_found(folders: list[Path], name: str) -> Path:
    """folders[i] / name for the first folder that holds it (the last folder's path where none does)."""
    return next((folder / name for folder in folders if (folder / name).is_file()), folders[-1] / name)


def cells_table(*folders: Path) -> list[str]:
    """The cells table from bench files named SET-DOMAIN-tT.json, each from the first of `folders` that holds it (a
    newer version's cells first, an older one's for the cells it did not measure again)."""
    lines = ["| set, T | math | code | chat |", "| --- | --- | --- | --- |"]
    for temperature in ("0", "1"):
        for prompt_set in ("eval", "fresh"):
            found = [first_found(list(folders), f"{prompt_set}-{domain}-t{temperature}.json") for domain in DOMAINS]
            if any(f.is_file() for f in found):
                lines.append(f"| {prompt_set}, {temperature} | "
                             + " | ".join(cell(f) if f.is_file() else "—" for f in found) + " |")
    return lines


def main(argv=None) -> None:
    args = list(argv or sys.argv[1:])
    if args[0] == "--cells":
        print("\n".join(cells_table(*map(Path, args[1:]))))
        return
    folder = Path(args[0])
    print("| domain | forward | threads | llama.cpp tok/s | plain tok/s (of llama.cpp) | default drafter tok/s (of "
          "llama.cpp) | drafter / plain | tokens per round | drafted = plain |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ORDER:
        for domain in DOMAINS:
            found = sorted(folder.glob(f"{name}-{domain}.json")) + sorted(folder.glob(f"{name}-{domain}-20*.json"))
            if found:  # OUT_DIR/NAME-DOMAIN.json as the ladder writes it, or dated as kept in docs/results/engine
                print(row(found[-1], domain))


if __name__ == "__main__":
    main()
