"""The precision ladder's table (docs/engine.md) from scripts/engine_ladder.sh's JSON files.

python -m scripts.engine_table DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = ("q4", "q4-python", "bf16", "fp32", "fp32-transformers")
DOMAINS = ("math", "code", "chat")


def row(path: Path, domain: str) -> str:
    d = json.loads(path.read_text())
    anchor = d["llama_cpp"]
    return (f"| {domain} | {d['precision']} | {d['threads']} | {anchor['tokens_per_s']:.1f} | "
            f"{d['baseline_tokens_per_s']:.1f} ({anchor['plain_vs_llama_cpp']:.2f}) | {d['tokens_per_s']:.1f} "
            f"({anchor['drafter_vs_llama_cpp']:.2f}) | {d['speedup']:.2f}× | {d['acceptance_length']:.2f} | "
            f"{'yes' if d['identical_to_baseline'] else 'NO'} |")


def main(argv=None) -> None:
    folder = Path((argv or sys.argv[1:])[0])
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
