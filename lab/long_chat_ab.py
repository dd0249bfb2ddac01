"""The app's default in long conversations with the verify cost read after each reply's context against one curve
measured after 256 cached positions, side by side in one run.

python -m lab.long_chat_ab --prompts eval_chat --turns 10 --conversations 2 [--offset 0] [--temperature 0] \
    --out docs/results/long-chat-curves-DATE.json

Each conversation takes `turns` prompts in order as its user turns; every turn's reply is written three ways, their
order rotated: plain decoding, the default with `CostCurves.at(256)` ("one curve") and the default with
`CostCurves.for_reply` ("per context"), each with its own measured policy state and prefix cache, as the app keeps
them. The conversation goes on with plain decoding's reply, so every side sees the same prompts. Per turn: the
context, each side's speed over plain decoding's; at T = 0 whether the three replies were identical.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from app import bench
from core.decoding.engine import GenerationConfig
from core.decoding.prefix import PrefixCache
from core.runtime.target import load_target
from core.runtime.verify_cost import CONTEXTS, cost_curves
from drafter.spec import choice_spec
from lab.harness import mean_se, speed

SIDES = ("plain", "one curve", "per context")


def turn(target, runners: dict, curves, ids: list[int], gen: GenerationConfig, plain_prefix: PrefixCache,
         shift: int) -> dict[str, bench.Run]:
    """One user turn written by every side, the order rotated by `shift`."""
    curve = {"one curve": curves.at(CONTEXTS[0]), "per context": curves.for_reply(len(ids), gen.max_new_tokens)}

    def write(side: str) -> bench.Run:
        if side == "plain":
            return bench.run_engine(target, ids, gen, None, prefix=plain_prefix)
        return runners[side].run(ids, runners[side].generation(gen, curve[side]))

    order = SIDES[shift % 3:] + SIDES[: shift % 3]
    return {side: write(side) for side in order}


def summary(rows: list[dict]) -> dict:
    """Mean speed over plain decoding per side (± standard error) and the paired difference per context − one."""
    out = {side: mean_se([row[side] for row in rows]) for side in SIDES[1:]}
    out["per context - one curve"] = mean_se([row["per context"] - row["one curve"] for row in rows])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=10, help="user turns a conversation")
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--offset", type=int, default=0, help="prompts of the file skipped first")
    bench.add_run_args(parser)
    args = parser.parse_args(argv)
    fields = bench.run_fields(args, tuning=True)
    target = load_target(fields["target"])
    count = args.offset + args.turns * args.conversations
    prompts = [p for path in fields["prompts"] for p in bench.read_prompts(path, count)][args.offset:]
    bench.warm_up(target)
    curves = cost_curves(target)
    runners = {side: bench.make_runner(choice_spec(), target).with_draft_cost(target) for side in SIDES[1:]}
    rows = []
    for c in range(args.conversations):
        messages, plain_prefix = [], PrefixCache()
        for t in range(args.turns):
            i = c * args.turns + t
            messages = messages + [{"role": "user", "content": prompts[i]}]
            ids = target.chat_ids(messages)
            gen = GenerationConfig(fields["max_new_tokens"], sampling=fields["sampling"], seed=fields["seed"] + i)
            runs = turn(target, runners, curves, ids, gen, plain_prefix, i)
            rows.append({"conversation": c, "turn": t, "context": len(ids),
                         **{side: speed(runs[side]) / speed(runs["plain"]) for side in SIDES[1:]},
                         "identical": len({tuple(r.tokens) for r in runs.values()}) == 1})
            messages.append({"role": "assistant", "content": target.decode(runs["plain"].tokens)})
            print(json.dumps(rows[-1]), flush=True)
    result = {"prompts": list(fields["prompts"]), "offset": args.offset, "turns": args.turns,
              "max_new_tokens": fields["max_new_tokens"], "temperature": fields["sampling"].temperature,
              "curves": curves.as_dict(), "summary": summary(rows), "per_turn": rows}
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
