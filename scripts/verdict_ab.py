"""How the copied rounds' verdict (core.policy.PolicyState.lookup) counts time, side by side in one process: the
verdict as it ships, with each round's seconds counted in plain steps of its own time (MeasuredPays.relative), with
no budget wait before 16 copied rounds were measured (confident_rounds), and with both. Each prompt's plain reply and
the arms' drafted ones run in rotated order; every arm carries its own PolicyState from prompt to prompt as the app
does from reply to reply, and all of them start afresh every --restart-every prompts (a new start of the app).

python -m scripts.verdict_ab --prompts fresh_math --limit 24 --restart-every 8 --quant q4 \
    --out docs/results/engine/verdict-ab-trial-math-t0-DATE.json

Each arm's figure is the mean over prompts of its tokens a second over the plain reply's, with the standard error,
and each arm over the shipped verdict, paired by prompt; also over the first two replies after each start alone. At
T = 0 every reply is checked against plain decoding.
"""
from __future__ import annotations

from app import bench
from core.engine import GenerationConfig
from core.policy import COPIED_WINDOW, MeasuredPays, PolicyState
from scripts.copies_window_ab import prepare, run_arms, summary
from scripts.products_ab import print_and_save, rounded

ARMS = {  # label -> the copied rounds' verdict
    "shipped": lambda: MeasuredPays(window=COPIED_WINDOW),
    "relative": lambda: MeasuredPays(window=COPIED_WINDOW, relative=True),
    "confident 16": lambda: MeasuredPays(window=COPIED_WINDOW, confident_rounds=16),
    "both": lambda: MeasuredPays(window=COPIED_WINDOW, relative=True, confident_rounds=16),
}
BASE = "shipped"


def add_args(parser) -> None:
    parser.add_argument("--restart-every", type=int, default=8, help="prompts between fresh starts of every arm")


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv, add_args)
    arms = list(ARMS)
    sampling, budget = fields["sampling"], fields["max_new_tokens"]
    prompts = [prompt for path in fields["prompts"] for prompt in bench.read_prompts(path, fields["limit"])]
    rows, sources, states = [], {arm: {} for arm in arms}, {}
    for i, prompt in enumerate(prompts):
        if i % args.restart_every == 0:
            states = {arm: PolicyState(lookup=ARMS[arm]()) for arm in arms}
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        gen = runner.generation(GenerationConfig(budget, sampling=sampling, seed=fields["seed"] + i),
                                curves.for_reply(len(ids), budget))
        rows.append(run_arms(target, runner, ids, i, arms, lambda arm: gen, states, sources, sampling.greedy))
    first = [row for i, row in enumerate(rows) if i % args.restart_every < 2]
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"], "restart_every": args.restart_every,
              "temperature": sampling.temperature, "max_new_tokens": budget,
              "summary": summary(rows, BASE, arms), "first_two_after_a_start": summary(first, BASE, arms),
              "rounds_by_source": sources, "per_prompt": rows}
    print_and_save(rounded(result), args.out)


if __name__ == "__main__":
    main()
