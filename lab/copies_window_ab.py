"""How many rounds the copied rounds' verdict reads (core.policy.PolicyState.lookup), side by side in one process: the
app's default with the verdict over the last 64 rounds of each kind (the default since 0.34.0), over 16 (before), and
never skipping copies, each prompt's plain reply and the three drafted ones in rotated order, every arm carrying its
own PolicyState from prompt to prompt as the app does from reply to reply.

python -m lab.copies_window_ab --prompts eval_chat --limit 24 [--temperature 1] --quant q4 \
    --out docs/results/engine/copies-window-ab-chat-t0-DATE.json

Each arm's figure is the mean over prompts of its tokens a second over the plain reply's, with the standard error,
and each arm against the 16-round verdict, paired by prompt. At T = 0 every reply is checked against plain decoding.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch

from app import bench
from core.engine import GenerationConfig
from core.policy import COPIED_WINDOW, MeasuredPays, PolicyState
from core.target import load_target
from core.verify_cost import cost_curves
from drafter.spec import choice_spec
from lab.long_chat_ab import mean_se, rotated, speed


class NeverSkip(MeasuredPays):
    """A verdict that never skips: the copies are verified wherever the per-round cut keeps them."""

    def draft_now(self) -> bool:
        return True


ARMS = {  # label -> the copied rounds' verdict
    f"window {COPIED_WINDOW}": lambda: MeasuredPays(window=COPIED_WINDOW),
    "window 16": lambda: MeasuredPays(window=16),
    "never skip": NeverSkip,
}
BASE = "window 16"


def summary(rows: list[dict], base: str = BASE, arms: list[str] | None = None) -> dict:
    """rows: per prompt, tokens a second by arm and "plain" -> each arm over plain, and each arm over `base`, paired
    by prompt. arms: their order in the result (default: the first row's)."""
    arms = arms or [arm for arm in rows[0] if arm != "plain"]
    out = {f"{arm} / plain": mean_se([row[arm] / row["plain"] for row in rows]) for arm in arms}
    out.update({f"{arm} / {base}": mean_se([row[arm] / row[base] for row in rows]) for arm in arms if arm != base})
    return out


def reply(target, ids: list[int], gen: GenerationConfig, drafter, state: PolicyState | None) -> tuple[list[int], float,
                                                                                                      dict]:
    """(tokens, tokens a second, rounds by source) of one reply."""
    run = bench.run_engine(target, ids, gen, drafter, measured=state)
    sources: dict[str, int] = {}
    for event in run.events[1:]:
        sources[event.source] = sources.get(event.source, 0) + 1
    return run.tokens, speed(run), sources


def run_arms(target, runner, ids: list[int], i: int, arms: list[str], gen_for, states: dict, sources: dict,
             greedy: bool, drafters: dict | None = None) -> dict:
    """Prompt i's plain reply and each arm's drafted one (gen_for(arm) its GenerationConfig, states[arm] its
    PolicyState, drafters[arm] its drafter where given, else the runner's), in an order rotated by i -> tokens a second
    by arm and "plain"; each arm's rounds by source are added to sources[arm], and at T = 0 every reply is checked
    against plain decoding."""
    row, outputs = {}, {}
    for arm in rotated(["plain", *arms], i):
        drafter = None if arm == "plain" else (drafters or {}).get(arm, runner.drafter)
        outputs[arm], row[arm], counted = reply(target, ids, gen_for(arm), drafter, states.get(arm))
        for source, n in counted.items():
            if arm != "plain":
                sources[arm][source] = sources[arm].get(source, 0) + n
    if greedy and any(out != outputs["plain"] for out in outputs.values()):
        raise SystemExit(f"prompt {i}: a drafted reply differs from plain decoding at T = 0")
    print(i, {arm: round(row[arm] / row["plain"], 3) for arm in arms}, flush=True)
    return row


def prepare(doc: str, argv=None, add_args=None):
    """What a comparison of the default's arms starts from: (its arguments, their run fields, the target warmed up, its
    start-up cost curves, the app's default drafter as a runner with its call cost measured). add_args(parser) adds a
    comparison's own flags."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_run_args(parser)
    if add_args is not None:
        add_args(parser)
    args = parser.parse_args(argv)
    fields = bench.run_fields(args, tuning=True)
    torch.set_num_threads(2)
    target = load_target(fields["target"])
    bench.warm_up(target)
    return args, fields, target, cost_curves(target), bench.make_runner(choice_spec(), target).with_draft_cost(target)


def run_prompts(fields: dict, target, curves, runner, arms: list[str], states: dict,
                drafters: dict | None = None, restart_every: int = 0,
                fresh_states: Callable[[], dict] | None = None) -> tuple[list[dict], dict]:
    """Every prompt of the run through run_arms, every arm with the same generation settings (the app's, with the cost
    curve after the prompt's context) -> (tokens a second by arm and "plain" per prompt, rounds by source per arm).
    With restart_every, the arms start afresh from fresh_states() every that many prompts (a new start of the app)."""
    sampling, budget = fields["sampling"], fields["max_new_tokens"]
    rows, sources = [], {arm: {} for arm in arms}
    prompts = [prompt for path in fields["prompts"] for prompt in bench.read_prompts(path, fields["limit"])]
    for i, prompt in enumerate(prompts):
        if restart_every and i and i % restart_every == 0:
            states = fresh_states()
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        gen = runner.generation(GenerationConfig(budget, sampling=sampling, seed=fields["seed"] + i),
                                curves.for_reply(len(ids), budget))
        rows.append(run_arms(target, runner, ids, i, arms, lambda arm: gen, states, sources, sampling.greedy,
                             drafters))
    return rows, sources


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv)
    states = {arm: PolicyState(lookup=make()) for arm, make in ARMS.items()}
    rows, sources = run_prompts(fields, target, curves, runner, list(ARMS), states)
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"],
              "temperature": fields["sampling"].temperature, "max_new_tokens": fields["max_new_tokens"],
              "summary": summary(rows), "rounds_by_source": sources, "per_prompt": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
