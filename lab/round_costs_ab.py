"""Whether the adaptive cut should weigh the verify cost it measures in replies (core.drafting.policy.state.Costs,
the default since 0.35.0) or the start-up curve alone, side by side in one process: each prompt's plain reply and the
drafted ones in rotated order, every arm carrying its own PolicyState from prompt to prompt as the app does from reply
to reply. The start-up curve is measured once at the start, as the bench and the app measure it; the arms also run on a
curve whose every step past one position is half again as steep, as a start-up on a busy machine can read it.

python -m lab.round_costs_ab --prompts eval_code --limit 24 --quant q4 [--arms ARM ...] \
    --out docs/results/engine/round-costs-ab-code-t0-DATE.json

Each arm's figure is the mean over prompts of its tokens a second over the plain reply's, with the standard error, and
each arm over its twin (a measured arm over its start-up-only one; 64 rounds a length over 16), paired by prompt, where
both ran. At T = 0 every reply is checked against plain decoding. --arms runs some of them (default: all).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from app import bench
from core.decoding.engine import GenerationConfig
from core.drafting.policy.config import DEFAULTS
from core.drafting.policy.state import Costs, PolicyState
from lab.harness import mean_se, prepare, run_arms

STEEPER = 1.5  # the steep start-up: 1 + 1.5 (c_n - 1)


class StartUpOnly(Costs):
    """The cut weighs the start-up curve alone (before 0.35.0)."""

    def record(self, fed: int, seconds: float) -> bool:
        return False


ARMS = {  # label -> (the round costs it keeps, whether its start-up curve is the steep one)
    "measured": (Costs, False),
    "start-up only": (StartUpOnly, False),
    "measured, steep start": (Costs, True),
    "start-up only, steep start": (StartUpOnly, True),
    # more rounds a length, so more weight than 16's
    "measured, 64 rounds": (lambda: Costs(replace(DEFAULTS, cost_window=64)), False),
}
TWINS = {"measured": "start-up only", "measured, steep start": "start-up only, steep start",
         "measured, 64 rounds": "measured"}  # arm -> the arm it is paired against


def steeper(curve: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(1.0 + STEEPER * (cost - 1.0) for cost in curve)


def summary(rows: list[dict]) -> dict:
    """rows: per prompt, tokens a second by arm and "plain" -> each arm over plain, each arm over its twin where both
    ran."""
    arms = [arm for arm in rows[0] if arm != "plain"]
    out = {f"{arm} / plain": mean_se([row[arm] / row["plain"] for row in rows]) for arm in arms}
    for arm in arms:
        if TWINS.get(arm) in arms:
            out[f"{arm} / {TWINS[arm]}"] = mean_se([row[arm] / row[TWINS[arm]] for row in rows])
    return out


def add_args(parser) -> None:
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="the arms to run")


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv, add_args)
    arms = args.arms
    states = {arm: PolicyState(costs=ARMS[arm][0]()) for arm in arms}
    sampling, budget = fields["sampling"], fields["max_new_tokens"]
    rows, sources, start_curves = [], {arm: {} for arm in arms}, []
    prompts = [prompt for path in fields["prompts"] for prompt in bench.read_prompts(path, fields["limit"])]
    for i, prompt in enumerate(prompts):
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        curve = curves.for_reply(len(ids), budget)
        start_curves.append(curve[:6])
        gen = GenerationConfig(budget, sampling=sampling, seed=fields["seed"] + i)

        def gen_for(arm: str, curve=curve, gen=gen) -> GenerationConfig:
            return runner.generation(gen, steeper(curve) if arm != "plain" and ARMS[arm][1] else curve)

        rows.append(run_arms(target, runner, ids, i, arms, gen_for, states, sources, sampling.greedy))
    measured_curves = {arm: states[arm].costs.curve(steeper(start_curves[-1]) if ARMS[arm][1] else start_curves[-1])[:6]
                       for arm in arms}
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"], "temperature": sampling.temperature,
              "max_new_tokens": budget, "summary": summary(rows), "rounds_by_source": sources,
              "start_up_curve_last_prompt": start_curves[-1], "curve_after_last_prompt": measured_curves,
              "per_prompt": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("summary", "rounds_by_source", "curve_after_last_prompt")}, indent=1))


if __name__ == "__main__":
    main()
