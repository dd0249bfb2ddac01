"""When the copied rounds' verdict (core.drafting.policy.state.PolicyState.copies) may set its long wait, side by side
in one process: from its first verdict (three copied and three plain rounds, as in 0.40.0) or, at T = 0, only once 16
copied rounds were measured (PolicyConfig.copied_patience, the default since 0.41.0: before that a losing verdict only
backs off 1, 2, 4 ... rounds). At T > 0 the two arms are the same since 0.41.0 (the T = 1 runs in docs/journal/engine.md
were made with the patience at every temperature, which lost there). Each prompt's plain reply and the arms' drafted
ones run in rotated order; every arm carries its own PolicyState from prompt to prompt as the app does from reply to
reply, and all of them start afresh every --restart-every prompts (a new start of the app: the first replies after one
are where a verdict read from a few rounds had switched copies off).

python -m lab.verdict_ab --prompts tuning_math --limit 24 --restart-every 8 [--patience 8 16 32] --quant q4 \
    --out docs/results/engine/verdict-ab-math-t0-DATE.json

Each arm's figure is the mean over prompts of its tokens a second over the plain reply's, with the standard error,
and the default over 0.40.0's verdict, paired by prompt; also over the first two replies after each start alone. At
T = 0 every reply is checked against plain decoding.
"""
from __future__ import annotations

from core.drafting.policy.config import DEFAULTS
from core.drafting.policy.state import PolicyState
from lab.copies_window_ab import summary
from lab.harness import prepare, print_and_save, rounded, run_prompts

BASE = "0.40.0"  # the verdict's long wait from its first reading


def arms_for(patience: list[int]) -> dict:
    """label -> the policy constants an arm sets: 0.40.0's verdict (no patience), and the patient one for each count."""
    return {BASE: {"copied_patience": 0}, **{f"confident {n}": {"copied_patience": n} for n in patience}}


def add_args(parser) -> None:
    parser.add_argument("--restart-every", type=int, default=8, help="prompts between fresh starts of every arm")
    parser.add_argument("--patience", type=int, nargs="+", default=[DEFAULTS.copied_patience],
                        help="copied rounds before the long wait, one arm each (default: the app's)")


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv, add_args)
    policies = arms_for(args.patience)
    arms = list(policies)

    def fresh_states() -> dict:
        return {arm: PolicyState() for arm in arms}

    rows, sources = run_prompts(fields, target, curves, runner, arms, fresh_states(),
                                restart_every=args.restart_every, fresh_states=fresh_states, policies=policies)
    first = [row for i, row in enumerate(rows) if i % args.restart_every < 2]
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"], "restart_every": args.restart_every,
              "temperature": fields["sampling"].temperature, "max_new_tokens": fields["max_new_tokens"],
              "summary": summary(rows, BASE, arms), "first_two_after_a_start": summary(first, BASE, arms),
              "rounds_by_source": sources, "per_prompt": rows}
    print_and_save(rounded(result), args.out)


if __name__ == "__main__":
    main()
