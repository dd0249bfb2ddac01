"""What a cheaper network call would give the app's default: each arm charges the network's call at a fraction f
(1, 0.5, 0.25) of its measured time, through the engine's clock, so the policy sees the cheaper call and the reply's
time counts it; each prompt's plain reply and the three arms' replies in rotated order, every arm with its own
PolicyState. The saving is emulated, not made: the figure bounds what a faster call could give this policy.

python -m lab.call_cost_ab --prompts eval_math --limit 24 --quant q4 --out FILE.json
"""
from __future__ import annotations

import json
import time
from dataclasses import replace

from app import bench
from core.decoding.engine import GenerationConfig, generate
from core.drafting.policy.state import PolicyState
from lab.harness import mean_se, prepare, rotated

FRACTIONS = (1.0, 0.5, 0.25)


class ChargedClock:
    """perf_counter less the part of each network call that an arm does not charge."""

    def __init__(self):
        self.saved, self.fraction = 0.0, 1.0

    def __call__(self) -> float:
        return time.perf_counter() - self.saved

    def charging(self, propose):
        def charged(*args, **kwargs):
            start = time.perf_counter()
            out = propose(*args, **kwargs)
            self.saved += (1 - self.fraction) * (time.perf_counter() - start)
            return out
        return charged


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv)
    hybrid, clock = runner.drafter, ChargedClock()
    hybrid.main.propose = clock.charging(hybrid.main.propose)
    states = {f: PolicyState() for f in FRACTIONS}
    prompts = [p for path in fields["prompts"] for p in bench.read_prompts(path, fields["limit"])]
    rows = []
    for i, prompt in enumerate(prompts):
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        base = runner.generation(GenerationConfig(fields["max_new_tokens"], sampling=fields["sampling"],
                                                  seed=fields["seed"] + i),
                                 curves.for_reply(len(ids), fields["max_new_tokens"]))
        row, outputs = {}, {}
        for arm in rotated(["plain", *FRACTIONS], i):
            clock.saved, clock.fraction = 0.0, 1.0 if arm == "plain" else arm
            gen = base if arm == "plain" else replace(base, draft_cost=base.draft_cost * arm)
            start = clock()
            events = list(generate(target, ids, gen, None if arm == "plain" else hybrid,
                                   measured=None if arm == "plain" else states[arm], clock=clock))
            outputs[arm] = [t for ev in events for t in ev.committed]
            row[str(arm)] = len(outputs[arm]) / (clock() - start)
            if arm != "plain":
                row[f"net{arm}"] = sum(ev.source == "drafter" for ev in events)
        if fields["sampling"].greedy and any(out != outputs["plain"] for out in outputs.values()):
            raise SystemExit(f"prompt {i}: a drafted reply differs from plain decoding at T = 0")
        rows.append(row)
        print(i, {f: round(row[str(f)] / row["plain"], 3) for f in FRACTIONS}, flush=True)
    for f in FRACTIONS:
        print(f, mean_se([row[str(f)] / row["plain"] for row in rows]),
              "network rounds", sum(row[f"net{f}"] for row in rows))
    with open(args.out, "w") as out:
        json.dump(rows, out)


if __name__ == "__main__":
    main()
