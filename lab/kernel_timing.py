"""Time the products the engine and the drafter run, in cache, at 1..17 rows: the q4 layers' shapes through torch's
int4 kernel and through the native step's q4_mm (core.runtime.cpu_linear.Int4Linear both ways), and the drafter trunk's
fp32
shapes through torch's linear and the native trunk's kernel (drafter.runtime.native_trunk).

python -m lab.kernel_timing [--threads 2] [--rows 1 2 5 9 17]

Prints microseconds a call (the best of five batches) for each shape and row count, and whether every row of the
17-row product equals that row computed alone (batch invariance).
"""
from __future__ import annotations

import argparse
import time

import torch

from core.runtime import native
from core.runtime.cpu_linear import Int4Linear
from drafter.runtime import native_trunk

# SmolLM2-135M's q4 products (qkv, o, gate_up, down) and its LM head's shape
Q4_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]
TRUNK_SHAPES = [(256, 576), (768, 256), (256, 256), (1024, 256), (256, 1024), (576, 256), (4096, 576)]


def best_us(fn, x, calls: int) -> float:
    for _ in range(3):
        fn(x)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def invariant(fn, x: torch.Tensor) -> bool:
    full = fn(x)
    return all(torch.equal(fn(x[t : t + 1]), full[t : t + 1]) for t in range(x.shape[0]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 9, 17])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    step, why = native.load()
    trunk, why_trunk = native_trunk.load()
    if step is None or trunk is None:
        raise SystemExit(f"the native kernels are not built here: {why or why_trunk}")
    torch.manual_seed(0)
    with torch.inference_mode():
        for out_f, in_f in Q4_SHAPES:
            linear = torch.nn.Linear(in_f, out_f, bias=False)
            sides = {"torch int4": Int4Linear(linear), "native q4_mm": Int4Linear(linear, native=step)}
            x = torch.randn(max(args.rows), in_f).bfloat16()
            calls = 10 if out_f > 10000 else 100
            for name, fn in sides.items():
                times = "  ".join(f"{r}: {best_us(fn, x[:r].contiguous(), calls):7.0f}" for r in args.rows)
                print(f"q4 {out_f}x{in_f:<5} {name:13s} {times}  invariant={invariant(fn, x)}")
        for out_f, in_f in TRUNK_SHAPES:
            weight = torch.randn(out_f, in_f)
            packed = native_trunk.NativeLinear(trunk, weight)
            sides = {"torch linear": lambda x, w=weight: torch.nn.functional.linear(x, w), "native": packed}
            x = torch.randn(max(args.rows), in_f)
            for name, fn in sides.items():
                times = "  ".join(f"{r}: {best_us(fn, x[:r].contiguous(), 50):7.0f}" for r in args.rows)
                print(f"fp32 {out_f}x{in_f:<5} {name:12s} {times}")


if __name__ == "__main__":
    main()
