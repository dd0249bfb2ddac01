"""How a phrasebook's copies fare on held-out replies, offline: at T = 0 the target's reply is fixed, so the tokens a
copy would keep at any position follow from the copy and the stored reply alone (as drafter/evaluation/evaluate.py does
for the network).

For every position of every held-out reply, the phrasebook is looked up on the tokens before it (as the engine looks
it up on the conversation); a copy keeps its tokens up to the first that differs from the reply. Reported per held-out
folder: how often a copy exists (hit), tokens kept per position, and per matched suffix length, each slot's
acceptance given the earlier slots accepted (what core.drafting.policy.state.Acceptance measures in a conversation),
with the copies that reached it.

python -m drafter.evaluation.phrasebook_check --held data/smollm2-val data/smollm2-magpie-check \\
    [--book weights/smollm2-135m-instruct/phrasebook | --data DIR ... --length 16] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from core.drafting import phrasebook
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
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
