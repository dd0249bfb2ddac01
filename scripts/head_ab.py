"""The next-token head against none, side by side in the app's default, in one process: each prompt's plain reply and
the drafted reply of each arm in rotated order, the same network, prompt lookup and phrasebook in both, every arm
carrying its own PolicyState from prompt to prompt as the app does from reply to reply.

python -m scripts.head_ab --prompts eval_chat --limit 24 [--temperature 1] --quant q4 \
    [--head weights/smollm2-135m-instruct/head] --out docs/results/engine/head-ab-chat-t0-DATE.json

Each arm's figure is the mean over prompts of its tokens a second over the plain reply's, with the standard error, and
the head's arm over the arm without it, paired by prompt. At T = 0 every reply is checked against plain decoding.
"""
from __future__ import annotations

from core.drafting import LookupHybrid
from core.policy import PolicyState
from drafter.head import load_head
from drafter.registry import target_phrasebook
from drafter.runtime import default_weights
from scripts.copies_window_ab import prepare, run_prompts, summary
from scripts.products_ab import print_and_save, rounded

ARMS = ("no head", "head")


def add_args(parser) -> None:
    parser.add_argument("--head", help="a head folder (drafter.head); default: the target's shipped one")


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv, add_args)
    network = runner.drafter.main  # the app's default network, shared: the arms differ only in the head
    head = load_head(args.head or default_weights(target.identity["name"], "head"), target)
    book = target_phrasebook(target)
    drafters = {"no head": LookupHybrid(network, phrasebook=book),
                "head": LookupHybrid(network, phrasebook=book, head=head)}
    states = {arm: PolicyState() for arm in ARMS}
    rows, sources = run_prompts(fields, target, curves, runner, list(ARMS), states, drafters)
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"],
              "temperature": fields["sampling"].temperature, "max_new_tokens": fields["max_new_tokens"],
              "head": str(args.head or "shipped"), "summary": summary(rows, ARMS[0], list(ARMS)),
              "rounds_by_source": sources, "per_prompt": rows}
    print_and_save(rounded(result), args.out)


if __name__ == "__main__":
    main()
