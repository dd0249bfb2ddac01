"""What capturing the drafter's features only where its network may be called (core.decoding.engine.captures) gives the
app's default, side by side in one process: the default as it ships ("as needed"), the same drafter with its features
captured in every forward as before 0.45.0 ("every round"), and its free sources without the network ("copies only", no
features at all: what the network costs or brings in all), each prompt's plain reply and the three drafted ones in
rotated order, every arm carrying its own PolicyState from prompt to prompt as the app does.

python -m lab.capture_ab --prompts eval_math --limit 24 [--temperature 1] --quant q4 \
    --out docs/results/engine/capture-ab-math-t0-DATE.json

Each arm's figure is the mean over prompts of its tokens a second over the plain reply's, with the standard error, and
each arm over "every round", paired by prompt. At T = 0 every reply is checked against plain decoding.
"""
from __future__ import annotations

import json
from pathlib import Path

from core.drafting.base import LookupHybrid, NoNetwork
from core.drafting.policy.state import PolicyState
from lab.copies_window_ab import summary
from lab.harness import prepare, run_prompts

BASE = "every round"


def arms(hybrid: LookupHybrid) -> dict:
    """label -> drafter: the default, the default capturing every round, its free sources alone."""
    every = LookupHybrid(hybrid.main, hybrid.branch, hybrid.phrasebook)
    every.context_window = None  # the engine then captures in every forward
    copies = LookupHybrid(NoNetwork(hybrid.max_block_size), hybrid.branch, hybrid.phrasebook)
    return {"as needed": hybrid, BASE: every, "copies only": copies}


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv)
    drafters = arms(runner.drafter)
    states = {arm: PolicyState() for arm in drafters}
    rows, sources = run_prompts(fields, target, curves, runner, list(drafters), states, drafters)
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"],
              "temperature": fields["sampling"].temperature, "max_new_tokens": fields["max_new_tokens"],
              "summary": summary(rows, BASE), "rounds_by_source": sources, "per_prompt": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
