"""How a phrasebook's copies fare on held-out replies, offline: at T = 0 the target's reply is fixed, so the tokens a
copy would keep at any position follow from the copy and the stored reply alone (as drafter/evaluation/evaluate.py does
for the
network).

For every position of every held-out reply, the phrasebook is looked up on the tokens before it (as the engine looks
it up on the conversation); a copy keeps its tokens up to the first that differs from the reply. Reported per held-out
folder: how often a copy exists (hit), tokens kept per position, and per matched suffix length, each slot's
acceptance given the earlier slots accepted (what core.drafting.policy.rates.LookupRates measures in a conversation),
with the copies that reached it.

python -m drafter.evaluation.phrasebook_check --held data/smollm2-val data/smollm2-magpie-check \\
    [--book weights/smollm2-135m-instruct/phrasebook | --data DIR ... --length 16] [--tries] [--out FILE.json]

--tries also scores copy tries (core.drafting.policy.policy.DraftPolicy.best_try): where the conversation's copy and the
phrasebook's
differ at their first token, how often each first token is the target's.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from core.drafting import phrasebook
from core.drafting.base import NgramDrafter
from drafter.data import load_sequences, refuse_held_out_folders
from drafter.runtime.drafters import default_weights

DEPTH = 16  # slots reported per copy


def copy_acceptance(book: phrasebook.Phrasebook, replies: list[tuple[list[int], int]]) -> dict:
    """replies: (tokens, prompt length) each. -> {"positions", "hit", "kept_per_position", "by_match": {n: {"rate":
    [per slot], "reached": [per slot]}}}"""
    positions, reached, accepted = phrasebook.copy_counts(book, replies, graded=False, depth=DEPTH)
    hits, kept = sum(reach[0] for reach in reached.values()), sum(map(sum, accepted.values()))
    by_match = {n: {"rate": [round(a / r, 4) if r else None for a, r in zip(accepted[n], reach)], "reached": reach}
                for n, reach in reached.items()}
    return {"positions": positions, "hit": hits / max(positions, 1), "kept_per_position": kept / max(positions, 1),
            "by_match": by_match}


def try_acceptance(book: phrasebook.Phrasebook, replies: list[tuple[list[int], int]]) -> dict:
    """Copy tries (core.drafting.policy.policy.DraftPolicy.best_try), offline at T = 0: at each position of each
    held-out reply (tokens, prompt length), the conversation's copy (prompt lookup over everything before it) and the
    phrasebook's; where both exist and differ at their first token, how often each first token is the reply's (the
    target's greedy token), by the lookup's matched suffix length. Exactly one can be: verified together, the try keeps
    the sum. -> {"positions", "both", "differ", "lookup_first", "book_first", "by_lookup_match": {n: {"share",
    "lookup_first", "book_first"}}}"""
    positions = both = 0
    counts: dict[int, list[int]] = {}  # lookup match -> [differing positions, lookup's first kept, book's first kept]
    for tokens, prompt_len in replies:
        lookup = NgramDrafter()
        lookup.extend(tokens[:prompt_len], None)
        for at in range(prompt_len, len(tokens) - 1):  # the anchor at `at`; its copies propose tokens[at + 1]
            copied, matched = lookup.lookup(tokens[at], 1)
            phrase, _ = book.lookup(tokens[max(0, at + 1 - book.config.max_ngram):at + 1], 1)
            lookup.extend([tokens[at]], None)
            positions += 1
            if not copied or not phrase:
                continue
            both += 1
            if copied[0] != phrase[0]:
                row = counts.setdefault(matched, [0, 0, 0])
                row[0] += 1
                row[1] += copied[0] == tokens[at + 1]
                row[2] += phrase[0] == tokens[at + 1]
    differ = sum(row[0] for row in counts.values())
    rate = lambda kept, n: round(kept / n, 4) if n else None  # noqa: E731
    return {"positions": positions, "both": rate(both, positions), "differ": rate(differ, positions),
            "lookup_first": rate(sum(row[1] for row in counts.values()), differ),
            "book_first": rate(sum(row[2] for row in counts.values()), differ),
            "by_lookup_match": {n: {"share": rate(row[0], positions), "lookup_first": rate(row[1], row[0]),
                                    "book_first": rate(row[2], row[0])} for n, row in sorted(counts.items())}}


def book_from_args(args, identity: dict) -> tuple[phrasebook.Phrasebook, dict]:
    """The phrasebook to check: built in memory from --data (never saved), else loaded from --book."""
    if args.data:
        refuse_held_out_folders(args.data, "the phrasebook")
        config = phrasebook.PhrasebookConfig(length=args.length)
        replies = [seq.tokens[max(0, seq.prompt_len - config.max_ngram):] for folder in args.data
                   for seq in load_sequences(folder)]
        return phrasebook.build(replies, config), {"built_from": args.data, "length": args.length}
    folder = Path(args.book or default_weights(identity["name"], "phrasebook"))
    return phrasebook.load(folder, identity), {"book": str(folder)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--held", nargs="+", required=True, help="data folders of held-out replies (never built from)")
    parser.add_argument("--book", default=None, help="a phrasebook folder (default: the target's shipped one)")
    parser.add_argument("--data", nargs="+", default=None, help="build the phrasebook from these data folders instead")
    parser.add_argument("--length", type=int, default=phrasebook.PhrasebookConfig.length,
                        help="with --data: continuation tokens kept per n-gram")
    parser.add_argument("--tries", action="store_true", help="also score copy tries: where the conversation's copy "
                        "and the phrasebook's differ at their first token, how often each is the target's")
    parser.add_argument("--out", default=None, help="where the JSON results are written")
    args = parser.parse_args(argv)
    identity = json.loads((Path(args.held[0]) / "meta.json").read_text())["target"]
    book, source = book_from_args(args, identity)
    results = {**source, "ngrams": len(book), "held": {}}
    for folder in args.held:
        replies = [(seq.tokens, seq.prompt_len) for seq in load_sequences(folder)]
        results["held"][folder] = copy_acceptance(book, replies)
        found = results["held"][folder]
        print(f"{folder}: hit {found['hit']:.3f}, kept per position {found['kept_per_position']:.3f}")
        if args.tries:
            tries = found["tries"] = try_acceptance(book, replies)
            print(f"  copies differing at their first token at {tries['differ']:.3f} of positions: the lookup's first "
                  f"kept {tries['lookup_first']:.3f}, the phrasebook's {tries['book_first']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
