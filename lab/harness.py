"""The lab's one paired-comparison harness: each prompt's plain reply and every arm's, in an order rotated prompt by
prompt so that drift on a noisy machine hits every side alike, each arm over plain decoding and over a base arm
paired by prompt, mean and standard error; the prompts read as a tuning comparison (a held-out set is refused:
app.bench.run_fields(tuning=True)). The comparisons in lab/ build their arms on it."""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from app import bench
from core.decoding.engine import GenerationConfig
from core.drafting.policy.state import PolicyState
from core.runtime.target import load_target
from core.runtime.verify_cost import cost_curves
from drafter.spec import choice_spec


def speed(run: bench.Run) -> float:
    return len(run.tokens) / run.seconds


def rotated(items: list, i: int) -> list:
    """items from the (i mod n)-th on: a comparison's arms in their order for prompt i, so each goes first in turn."""
    return items[i % len(items):] + items[: i % len(items)]


def mean_se(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "se": statistics.stdev(values) / len(values) ** 0.5}


def paired_summary(rows: list[dict], base: str, arms: list[str] | None = None) -> dict:
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
                fresh_states: Callable[[], dict] | None = None,
                policies: dict[str, dict] | None = None) -> tuple[list[dict], dict]:
    """Every prompt of the run through run_arms, every arm with the same generation settings (the app's, with the cost
    curve after the prompt's context; policies[arm]: policy constants it sets otherwise) -> (tokens a second by arm and
    "plain" per prompt, rounds by source per arm). With restart_every, the arms start afresh from fresh_states() every
    that many prompts (a new start of the app)."""
    sampling, budget = fields["sampling"], fields["max_new_tokens"]
    rows, sources = [], {arm: {} for arm in arms}
    prompts = [prompt for path in fields["prompts"] for prompt in bench.read_prompts(path, fields["limit"])]
    for i, prompt in enumerate(prompts):
        if restart_every and i and i % restart_every == 0:
            states = fresh_states()
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        gen = runner.generation(GenerationConfig(budget, sampling=sampling, seed=fields["seed"] + i),
                                curves.for_reply(len(ids), budget))
        def gen_for(arm: str, gen=gen) -> GenerationConfig:
            return replace(gen, policy=replace(gen.policy, **(policies or {}).get(arm, {})))

        rows.append(run_arms(target, runner, ids, i, arms, gen_for, states, sources, sampling.greedy, drafters))
    return rows, sources


def rounded(value, digits: int = 4):
    """Floats to `digits` significant digits, inside lists and dicts too (the file stays small)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    return value


def print_and_save(result: dict, out: str | None) -> None:
    """Print a result as one compact JSON line and, with `out`, write it there (the results folder keeps them small)."""
    text = json.dumps(result, separators=(",", ":"))
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
