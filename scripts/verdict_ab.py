"""How the copied rounds' verdict re-measures (core.policy.MeasuredPays), side by side in one process: the verdict as
shipped in 0.39.0 (after 3 rounds of each kind, then over the last 64, one new round a try), a first verdict only
after 16 copied and 8 plain rounds, and that with fresh verdicts (each wait lets go of the rounds it was set on, so
the next verdict reads 16 rounds copied after it), each prompt's plain reply and the three drafted ones in rotated
order, every arm carrying its own PolicyState from prompt to prompt as the app does from reply to reply.

python -m scripts.verdict_ab --prompts eval_math --limit 24 [--temperature 1] --quant q4 \
    --out docs/results/engine/verdict-ab-math-t0-DATE.json

Each arm's figure is the mean over prompts of its tokens a second over the plain reply's, with the standard error,
and each arm against the 0.39.0 verdict, paired by prompt. At T = 0 every reply is checked against plain decoding.
"""
from __future__ import annotations

import json
from pathlib import Path

from core.policy import COPIED_WINDOW, MeasuredPays, PolicyState
from scripts.copies_window_ab import prepare, run_prompts
from scripts.long_chat_ab import mean_se

BASE = "0.39.0"
ARMS = {  # label -> the copied rounds' verdict
    BASE: lambda: MeasuredPays(window=COPIED_WINDOW),
    "16 rounds first": lambda: MeasuredPays(window=COPIED_WINDOW, min_rounds=16, min_plain=8),
    "fresh verdicts": lambda: MeasuredPays(window=COPIED_WINDOW, min_rounds=16, min_plain=8, remeasure=True),
}


def summary(rows: list[dict]) -> dict:
    """rows: per prompt, tokens a second by arm and "plain" -> each arm over plain, and each arm over BASE, paired."""
    arms = [arm for arm in rows[0] if arm != "plain"]
    out = {f"{arm} / plain": mean_se([row[arm] / row["plain"] for row in rows]) for arm in arms}
    out.update({f"{arm} / {BASE}": mean_se([row[arm] / row[BASE] for row in rows]) for arm in arms if arm != BASE})
    return out


def main(argv=None) -> None:
    args, fields, target, curves, runner = prepare(__doc__, argv)
    states = {arm: PolicyState(lookup=make()) for arm, make in ARMS.items()}
    rows, sources = run_prompts(fields, target, curves, runner, list(ARMS), states)
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"],
              "temperature": fields["sampling"].temperature, "max_new_tokens": fields["max_new_tokens"],
              "summary": summary(rows), "rounds_by_source": sources,
              "per_prompt": [{arm: round(v, 1) for arm, v in row.items()} for row in rows]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"]))


if __name__ == "__main__":
    main()
