"""app.suite's variants against its first, paired by prompt, from its JSON files, into one compact file.

python -m lab.suite_pairs runs/suite-*.json [--costs try] --out docs/results/engine/NAME-DATE.json

app.suite runs plain decoding and every variant on each prompt in turn and reports each variant against plain
decoding; what two variants differ by is read best prompt by prompt (the machine's speed moves between prompts alike
for both). For each file: its prompts and temperature, each variant's summary (speedup over plain decoding with its
standard error, tokens a round, rounds by source, whether every T = 0 reply equalled plain decoding, its round costs),
each later variant over the first as the mean of the per-prompt ratios of tokens a second with its standard error, and
the per-prompt tokens a second of every variant.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from lab.harness import mean_se, print_and_save, rounded

KEPT = ("speedup", "speedup_se", "acceptance_length", "rounds_by_source", "identical_to_baseline")


def speeds(result: dict) -> list[float]:
    """Tokens a second of a variant's reply to each prompt."""
    return [row["tokens"] / row["s"] for row in result["per_prompt"]]


def pairs(suite: dict, costs: tuple[str, ...] = ()) -> dict:
    """One app.suite result -> its variants' summaries, each later variant over the first paired by prompt, and the
    per-prompt speeds. costs: keep only the round-cost rows whose source ends with one of these (all for none)."""
    results = suite["results"]
    first = speeds(results[0])
    kept = lambda rows: [row for row in rows if not costs or row["source"].endswith(costs)]  # noqa: E731
    out = {"prompts": suite["prompts_files"], "limit": suite["limit"], "temperature": suite["temperature"],
           "variants": [{"variant": r["variant"], **{k: r[k] for k in KEPT}, "round_costs": kept(r["round_costs"])}
                        for r in results],
           "paired": {f"{r['variant']} / {results[0]['variant']}":
                      mean_se([a / b for a, b in zip(speeds(r), first)]) for r in results[1:]},
           "tokens_per_s": {r["variant"]: speeds(r) for r in results}}
    return rounded(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="app.suite JSON results")
    parser.add_argument("--costs", nargs="+", default=(), help="keep only the round-cost rows whose source ends with "
                        "one of these words (e.g. phrasebook: the phrasebook's rows); default: every row")
    parser.add_argument("--out", required=True, help="where the compact JSON is written")
    args = parser.parse_args(argv)
    costs = tuple(args.costs)
    print_and_save({Path(name).stem: pairs(json.loads(Path(name).read_text()), costs) for name in args.files}, args.out)


if __name__ == "__main__":
    main()
