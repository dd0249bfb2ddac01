"""The verify cost curve: time of one target forward over T = 1, 2, 4, 8, 16, 17 new positions
after a context of C cached positions. It bounds every speedup: a round that commits gamma tokens
costs draft + verify(K+1), against gamma plain forwards of verify(1).

python -m app.verify_cost [--cached 256] [--repeats 20] [--target ID] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from app.engine import MAX_BLOCK_SIZE, keep_positions, target_forward
from app.target import add_target_args, load_target, target_config_from_args

POSITIONS = (1, 2, 4, 8, 16, 17)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def verify_cost(target, context: int, repeats: int, positions=POSITIONS) -> dict[int, float]:
    """Median seconds of one forward over T new positions; T values interleaved across repeats."""
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(min(100, target.vocab_size - 1), target.vocab_size, (context,), generator=gen).tolist()
    cache = DynamicCache(config=target.model.config)
    times: dict[int, list[float]] = {t: [] for t in positions}
    with torch.inference_mode():
        target_forward(target, prefix, cache, ())
        for _ in range(repeats + 1):
            for t in positions:
                block = torch.randint(min(100, target.vocab_size - 1), target.vocab_size, (t,), generator=gen).tolist()
                synchronize(target.device)
                start = time.perf_counter()
                target_forward(target, block, cache, ())
                synchronize(target.device)  # CUDA runs asynchronously: time the work, not its launch
                times[t].append(time.perf_counter() - start)
                keep_positions(cache, t, [])  # drop them all
    return {t: statistics.median(v[1:]) for t, v in times.items()}  # the first pass is a warm-up


def relative_curve(target, max_positions: int = MAX_BLOCK_SIZE + 1, context: int = 256,
                   repeats: int = 5) -> tuple[float, ...]:
    """Cost of 1..max_positions new positions relative to one, measured now on this machine (a few seconds);
    what the adaptive draft length (engine.best_draft_length) reads."""
    cost = verify_cost(target, context, repeats, range(1, max_positions + 1))
    return tuple(cost[t] / cost[1] for t in range(1, max_positions + 1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cached", type=int, default=256, help="positions already in the KV cache")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--positions", type=int, nargs="+", default=list(POSITIONS), help="T values to time")
    parser.add_argument("--out", default=None)
    add_target_args(parser)
    args = parser.parse_args(argv)
    target = load_target(target_config_from_args(args))
    cost = verify_cost(target, args.cached, args.repeats, sorted(set(args.positions) | {1}))
    result = {"target": target.name, "context": args.cached, "seconds": cost,
              "relative_to_one": {t: s / cost[1] for t, s in cost.items()}}
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
