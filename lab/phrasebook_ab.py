"""Two phrasebooks side by side in the app's default, in one process: each prompt's plain reply and one drafted reply
per book in rotated order, the same network and prompt lookup beside each book, every arm carrying its own PolicyState
from prompt to prompt as the app does from reply to reply.

python -m lab.phrasebook_ab --prompts eval_chat --limit 24 --quant q4 \
    --books weights/smollm2-135m-instruct/phrasebook runs/phrasebook-new \
    --out docs/results/engine/phrasebook-books-ab-chat-t0-DATE.json

Each arm's figure is the mean over prompts of its tokens a second over the plain reply's, with the standard error, and
the later books over the first, paired by prompt. At T = 0 every reply is checked against plain decoding.
"""
from __future__ import annotations

from core.drafting import phrasebook
from core.drafting.base import LookupHybrid
from core.drafting.policy.state import PolicyState
from lab.copies_window_ab import summary
from lab.harness import prepare, print_and_save, rounded, run_prompts


def add_args(parser) -> None:
    parser.add_argument("--books", nargs="+", required=True, help="phrasebook folders (core.drafting.phrasebook), "
                        "the first the one the others are paired against")


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv, add_args)
    arms = list(dict.fromkeys(args.books))
    network = runner.drafter.main  # the app's default network, shared: each arm differs only in its book
    drafters = {arm: LookupHybrid(network, phrasebook=phrasebook.load(arm, target.identity)) for arm in arms}
    states = {arm: PolicyState() for arm in arms}
    rows, sources = run_prompts(fields, target, curves, runner, arms, states, drafters)
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"],
              "temperature": fields["sampling"].temperature, "max_new_tokens": fields["max_new_tokens"],
              "books": {arm: len(drafters[arm].phrasebook) for arm in arms}, "summary": summary(rows, arms[0], arms),
              "rounds_by_source": sources, "per_prompt": rows}
    print_and_save(rounded(result), args.out)


if __name__ == "__main__":
    main()
