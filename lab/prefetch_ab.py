"""How far ahead the native products should prefetch their weight (lean_step.cpp's prefetch_blocks), side by side in
one process: the target's forwards over 1, 2 and 5 positions at one cached context, the distances alternated forward
by forward, then plain-decoding replies to real prompts, the distances alternated prompt by prompt.

python -m lab.prefetch_ab --prompts eval_chat eval_math --limit 24 --quant q4 --distances 0 2 3 --reps 600 \
    --out docs/results/engine/prefetch-ab-DATE.json

Forwards: the median milliseconds of each (distance, positions), and each distance's over no prefetch, paired by
iteration (mean ± standard error). Replies: each distance's tokens a second over no prefetch's, paired by prompt. The
products' values are the same at every distance (tests/test_cpu_linear.py), so replies are checked identical.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from app import bench
from core.decoding.engine import GenerationConfig
from core.decoding.prefix import PrefixCache
from core.runtime.forward import target_forward
from core.runtime.target import load_target
from lab.harness import mean_se, rotated, speed

POSITIONS = (1, 2, 5)  # a plain step, a one-token copy, a four-token draft


def forward_ms(target, module, context: list[int], distances: list[int], reps: int) -> dict:
    """distance -> positions -> milliseconds of each forward, distances alternated forward by forward."""
    cache, _, _ = PrefixCache().take(target, context, (), len(context) + max(POSITIONS) + 1)
    out = {d: {n: [] for n in POSITIONS} for d in distances}
    with torch.inference_mode():
        target_forward(target, context, cache, (), keep=1)
        for i in range(reps):
            n = POSITIONS[i % len(POSITIONS)]
            for distance in rotated(distances, i):
                module.set_prefetch_blocks(distance)
                start = time.perf_counter()
                target_forward(target, context[-n:], cache, ())
                out[distance][n].append((time.perf_counter() - start) * 1e3)
                cache.length -= n  # the same context every time
    return out


def forward_summary(ms: dict, base: int) -> dict:
    return {f"{d} blocks, {n} positions": {"median_ms": statistics.median(times),
                                           "over none": mean_se([t / b for t, b in zip(times, ms[base][n])])}
            for d, by_n in ms.items() for n, times in by_n.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_run_args(parser)
    parser.add_argument("--distances", type=int, nargs="+", default=[0, 3, 8])
    parser.add_argument("--reps", type=int, default=300, help="forwards per distance")
    args = parser.parse_args(argv)
    fields = bench.run_fields(args, tuning=True)
    distances = sorted(set(args.distances) | {0})
    torch.set_num_threads(2)
    target = load_target(fields["target"])
    module = getattr(getattr(target, "lean", None), "native", None)
    if module is None:
        raise SystemExit("this target's forward does not run through the native step (a q4 target on a CPU does)")
    bench.warm_up(target)
    prompts = [prompt for path in fields["prompts"] for prompt in bench.read_prompts(path, fields["limit"])]
    context = target.chat_ids([{"role": "user", "content": prompts[0]}])
    forwards = forward_summary(forward_ms(target, module, context, distances, args.reps), 0)
    rows = []
    for i, prompt in enumerate(prompts):
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        gen = GenerationConfig(fields["max_new_tokens"], sampling=fields["sampling"], seed=fields["seed"] + i)
        row, outputs = {}, {}
        for distance in rotated(distances, i):
            module.set_prefetch_blocks(distance)
            run = bench.run_engine(target, ids, gen, None)
            outputs[distance], row[distance] = run.tokens, speed(run)
        if fields["sampling"].greedy and any(out != outputs[0] for out in outputs.values()):
            raise SystemExit(f"prompt {i}: a reply differs between prefetch distances")
        rows.append(row)
        print(i, {d: round(row[d] / row[0], 3) for d in distances}, flush=True)
    result = {"prompts": list(fields["prompts"]), "limit": fields["limit"], "max_new_tokens": fields["max_new_tokens"],
              "context_positions": len(context), "reps": args.reps, "forwards": forwards,
              "plain replies over none": {d: mean_se([row[d] / row[0] for row in rows]) for d in distances},
              "per_prompt": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("forwards", "plain replies over none")}, indent=1))


if __name__ == "__main__":
    main()
