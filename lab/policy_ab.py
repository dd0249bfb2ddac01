"""The adaptive draft policy with its confidence calibration and skips against the one before it, side by side in
one run (app.suite's rotation).

python -m lab.policy_ab --prompts eval_math eval_code eval_chat --limit 5 --max-new-tokens 96 \
    --drafters flashmap,scale=0 dflash --out docs/results/policy-ab-t0-DATE.json

For each drafter spec, with adaptive=1:
  new          the app's default now: calibrated confidence (drafter/runtime/calibration.py), and the skips charge each
               draft for the drafter's call (core.drafting.policy.policy.DraftPolicy.call_cost)
  before       raw confidence, no drafter cost: the policy as it was (commit 5fcc3e1)
  calibrated   calibrated confidence, no drafter cost
  charged      raw confidence, drafter cost charged
Every output is checked against plain decoding (T = 0) as in app.suite. At T > 0 the arms differ only in the drafter
cost, which is charged at T = 0 only since commit e49702e's T = 1 run (GenerationConfig.charges_draft_cost).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from app import bench, suite
from core.runtime.target import load_target
from drafter.spec import RunSpec

ARMS = {  # label suffix -> (spec options, GenerationConfig overrides)
    "new": ({}, {}),
    "before": ({"calibrated": False}, {"draft_cost": 0.0}),
    "calibrated": ({}, {"draft_cost": 0.0}),
    "charged": ({"calibrated": False}, {}),
}


def arm_runner(base: bench.Runner, overrides: dict) -> bench.Runner:
    """The runner with its GenerationConfig overridden after the suite has filled it in."""
    if not overrides:
        return base
    return replace(base, run=lambda ids, gen, run=base.run: run(ids, replace(gen, **overrides)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafters", nargs="+", default=["flashmap,scale=0"], help="drafter specs (adaptive=1 added)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    bench.add_run_args(parser)
    args = parser.parse_args(argv)
    fields = bench.run_fields(args, tuning=True)
    target = load_target(fields["target"])
    labels, specs, runners = [], [], []
    for text in args.drafters:
        for arm in args.arms:
            options, overrides = ARMS[arm]
            parsed = RunSpec.parse(text)
            spec = RunSpec(replace(parsed.drafter, **options), adaptive=True, max_skip=parsed.max_skip)
            labels.append(f"{spec.text()} [{arm}]")
            specs.append(spec)
            runners.append((spec, overrides))
    cfg = suite.SuiteConfig(variants=tuple(labels), specs=tuple(specs), **fields)
    built = [arm_runner(bench.make_runner(spec, target), overrides) for spec, overrides in runners]
    result = suite.run_suite(cfg, target, built)
    for row, (_spec, overrides) in zip(result["results"], runners):
        row["overrides"] = overrides  # e.g. draft_cost 0: the measured cost above was not charged in this arm
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    for row in result["results"]:
        print(json.dumps({k: row[k] for k in ("variant", "speedup", "acceptance_length", "draft_cost",
                                              "identical_to_baseline")}))


if __name__ == "__main__":
    main()
