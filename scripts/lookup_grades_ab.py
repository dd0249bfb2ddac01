"""Prompt lookup's copies measured per grade (core.drafting.lookup_class: whether the matched suffix's earlier
occurrences agreed on the next token, with a prior per grade) against per match length alone (before 0.45.0), side by
side in the app's default in one process: each prompt's plain reply and one drafted reply per arm in rotated order,
the same network and phrasebook in both, every arm carrying its own PolicyState from prompt to prompt as the app does
from reply to reply.

python -m scripts.lookup_grades_ab --prompts eval_chat --limit 24 [--temperature 1] --quant q4 \
    --out docs/results/engine/lookup-grades-ab-chat-t0-DATE.json

Each arm's figure is the mean over prompts of its tokens a second over the plain reply's, with the standard error, and
the graded arm over the other, paired by prompt. At T = 0 every reply is checked against plain decoding.
"""
from __future__ import annotations

from core.drafting import Copy, LookupHybrid
from core.policy import PolicyState
from scripts.copies_window_ab import prepare, run_prompts, summary
from scripts.products_ab import print_and_save, rounded

GRADED, BY_LENGTH = "graded", "by match length"


class ByLength(LookupHybrid):
    """The conversation's copies keyed by their match length, from the common prior (as before 0.45.0)."""

    def propose_lookup(self, anchor: int, block_size: int) -> Copy | None:
        copied, matched = self.ngram.lookup(anchor, block_size)
        return Copy(copied, matched) if copied else None


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv)
    shipped = runner.drafter
    arms = [BY_LENGTH, GRADED]
    drafters = {GRADED: LookupHybrid(shipped.main, phrasebook=shipped.phrasebook),
                BY_LENGTH: ByLength(shipped.main, phrasebook=shipped.phrasebook)}
    states = {arm: PolicyState() for arm in arms}
    rows, sources = run_prompts(fields, target, curves, runner, arms, states, drafters)
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"],
              "temperature": fields["sampling"].temperature, "max_new_tokens": fields["max_new_tokens"],
              "summary": summary(rows, BY_LENGTH, arms), "rounds_by_source": sources, "per_prompt": rows}
    print_and_save(rounded(result), args.out)


if __name__ == "__main__":
    main()
