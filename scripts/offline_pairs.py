"""Paired differences between the variants of one `python -m drafter.evaluation.evaluate` run, and a compact copy of it.

Every variant of one run is measured on the same anchors (drafter/evaluation/evaluate.py), so two variants compare
round by
round: the difference of their tokens per round, per domain, with a standard error that treats each held-out
response as one draw (rounds of one response are not independent). The compact copy drops the per-round lists,
which make up most of the file, and keeps the pairs.

python -m scripts.offline_pairs runs/offline.json --pairs 0 1 2 3 [--out docs/results/X.json] [--command "..."]
(--pairs lists variant indices two by two: base, candidate, base, candidate, ...)
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

from scripts.results import read_json

DOMAINS = ("all", "math", "code", "chat")


def round_gains(base: dict, candidate: dict) -> dict[int, list[int]]:
    """Per response (sequence index), the candidate's accepted tokens minus the base's on each shared anchor."""
    if base["rounds"]["anchor"] != candidate["rounds"]["anchor"] or \
            base["rounds"]["sequence"] != candidate["rounds"]["sequence"]:
        raise ValueError(f"{base['variant']} and {candidate['variant']} were not measured on the same anchors")
    gains = defaultdict(list)
    for sequence, theirs, ours in zip(base["rounds"]["sequence"], base["rounds"]["n_accepted"],
                                      candidate["rounds"]["n_accepted"]):
        gains[sequence].append(ours - theirs)
    return gains


def clustered_mean(groups: list[list[int]]) -> tuple[float, float, int]:
    """Mean over all rounds and its standard error with each group (response) as one draw (a ratio estimator)."""
    n_rounds = sum(len(g) for g in groups)
    mean = sum(sum(g) for g in groups) / n_rounds
    if len(groups) < 2:
        return mean, float("nan"), n_rounds
    residuals = [sum(g) - mean * len(g) for g in groups]  # each response's excess over the mean
    variance = len(groups) / (len(groups) - 1) * sum(r * r for r in residuals) / n_rounds ** 2
    return mean, math.sqrt(variance), n_rounds


def pair(run: dict, base: dict, candidate: dict) -> dict:
    """The candidate minus the base, tokens per round, overall and per domain."""
    gains = round_gains(base, candidate)
    domains = run.get("sequence_domains") or []
    row = {"base": base["variant"], "candidate": candidate["variant"]}
    for domain in DOMAINS:
        groups = [g for seq, g in gains.items() if domain == "all" or (seq < len(domains) and domains[seq] == domain)]
        if not groups:
            continue
        mean, error, n_rounds = clustered_mean(groups)
        before = base[domain]["acceptance_length"]
        row[domain] = {"rounds": n_rounds, "difference": round(mean, 4), "standard_error": round(error, 4),
                       "ratio": round((before + mean) / before, 4)}
    return row


def compact(run: dict, pairs: list[dict], command: str | None) -> dict:
    """The run without its per-round lists and per-slot counts, with the pairs."""
    results = []
    for result in run["results"]:
        kept = {k: v for k, v in result.items() if k not in ("rounds", "per_slot_cross_entropy")}
        for domain in DOMAINS:
            if domain in kept:
                kept[domain] = {"rounds": kept[domain]["rounds"],
                                "acceptance_length": round(kept[domain]["acceptance_length"], 4)}
        results.append(kept)
    head = {k: v for k, v in run.items() if k not in ("results", "sequence_domains")}
    return {**head, "command": command, "results": results, "paired": pairs,
            "note": "per-round lists dropped (scripts.offline_pairs); paired: candidate minus base tokens per round "
                    "over the same anchors, standard error with each response as one draw"}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a drafter.evaluation.evaluate --out file (.json, or .json.gz)")
    parser.add_argument("--pairs", type=int, nargs="+", required=True, help="variant indices: base candidate ...")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--command", help="the evaluate command that made the run, kept in the compact copy")
    args = parser.parse_args(argv)
    if len(args.pairs) % 2:
        parser.error("--pairs takes indices two by two (base, candidate)")
    run = read_json(args.run)
    results = run["results"]
    pairs = [pair(run, results[a], results[b]) for a, b in zip(args.pairs[::2], args.pairs[1::2])]
    for row in pairs:
        cells = "  ".join(f"{d} {row[d]['difference']:+.3f} ± {row[d]['standard_error']:.3f} ({row[d]['ratio']:.3f}×)"
                          for d in DOMAINS if d in row)
        print(f"{row['candidate']}  vs  {row['base']}:  {cells}")
    if args.out:
        args.out.write_text(json.dumps(compact(run, pairs, args.command), indent=1) + "\n")


if __name__ == "__main__":
    main()
