"""How many rounds the copied rounds' verdict reads (core.drafting.policy.state.PolicyState.copies), side by side in one
process: the app's default with the verdict over the last 64 rounds of each kind (the default since 0.34.0), over 16
(before), and never skipping copies, each prompt's plain reply and the three drafted ones in rotated order, every arm
carrying its own PolicyState from prompt to prompt as the app does from reply to reply.

python -m lab.copies_window_ab --prompts eval_chat --limit 24 [--temperature 1] --quant q4 \
    --out docs/results/engine/copies-window-ab-chat-t0-DATE.json

Each arm's figure is the mean over prompts of its tokens a second over the plain reply's, with the standard error,
and each arm against the 16-round verdict, paired by prompt. At T = 0 every reply is checked against plain decoding.
"""
from __future__ import annotations

import json
from pathlib import Path

from core.drafting.policy.config import DEFAULTS
from core.drafting.policy.state import PolicyState, Verdict
from lab.harness import paired_summary, prepare, run_prompts


class NeverSkip(Verdict):
    """A verdict that never holds the copies back: they are verified wherever their offer pays."""

    def hold(self) -> str:
        return ""


ARMS = {  # label -> the copied rounds' verdict
    f"window {DEFAULTS.copied_window}": lambda: Verdict(window=DEFAULTS.copied_window),
    "window 16": lambda: Verdict(window=16),
    "never skip": lambda: NeverSkip(window=DEFAULTS.copied_window),
}
BASE = "window 16"


def summary(rows: list[dict], base: str = BASE, arms: list[str] | None = None) -> dict:
    """The arms over plain decoding and over the 16-round verdict (lab.harness.paired_summary)."""
    return paired_summary(rows, base, arms)


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv)
    states = {arm: PolicyState(copies=make()) for arm, make in ARMS.items()}
    rows, sources = run_prompts(fields, target, curves, runner, list(ARMS), states)
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"],
              "temperature": fields["sampling"].temperature, "max_new_tokens": fields["max_new_tokens"],
              "summary": summary(rows), "rounds_by_source": sources, "per_prompt": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
