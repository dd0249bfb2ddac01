"""What the next-token head's guess costs: warm (in a loop) and right after a one-position target forward, which
streams the target's weights through the caches (median of 200 and 100 guesses).

python -m scripts.head_cost --head runs/head-512 --quant q4
"""
from __future__ import annotations

import argparse
import time

import torch

from app import bench
from core.forward import keep_positions, target_forward
from core.prefix import PrefixCache
from core.target import add_target_args, load_target, target_config_from_args
from drafter.head import load_head


def median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[n // 2]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", required=True)
    add_target_args(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    target = load_target(target_config_from_args(args))
    bench.warm_up(target)
    head = load_head(args.head, target)
    layers = head.cfg.feature_layers
    features = torch.randn(head.cfg.features).to(torch.bfloat16)  # (F,)
    ids = target.chat_ids([{"role": "user", "content": "hello there, how are you"}])
    cache, _, _ = PrefixCache().take(target, ids, layers, 600)

    def after_forward():
        target_forward(target, [5], cache, layers)
        keep_positions(cache, 1, [])
        start = time.perf_counter()
        head.propose(features, 5)
        return time.perf_counter() - start

    with torch.inference_mode():
        target_forward(target, ids, cache, layers, keep=1)
        warm = median_ms(lambda: head.propose(features, 5), 200)
        cold = 1e3 * sorted(after_forward() for _ in range(100))[50]
    print(f"guess: warm {warm:.3f} ms, after a forward {cold:.3f} ms")


if __name__ == "__main__":
    main()
