"""A q4 prompt's prefill through the native step (a verify round's worth of positions a call) against the op-by-op
prefill, side by side on one loaded target, the two alternated prompt length by prompt length: what
core.runtime.target.native_prefill decides from.

python -m lab.prefill_ab [--lengths 40 200 600] [--repeats 6] [--out docs/results/engine/prefill-ab-DATE.json]

Prints and writes the median milliseconds of each (way, prompt length); random token ids, the cache new each time.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from core.runtime.forward import target_forward
from core.runtime.target import TargetConfig, load_target
from lab.harness import print_and_save

WAYS = {"native": True, "op by op": False}


def prefill_ms(target, ids: list[int], native: bool) -> float:
    """Milliseconds of one prefill of `ids` into a new cache, through the native step or op by op."""
    target.lean.native_prefill = native
    cache = target.new_cache(len(ids) + 1)
    with torch.inference_mode():
        start = time.perf_counter()
        target_forward(target, ids, cache, (), keep=1)
        return (time.perf_counter() - start) * 1e3


def compare(target, lengths: list[int], repeats: int) -> dict:
    """{way: {length: median ms}}, the first of repeats + 1 passes a warm-up."""
    gen = torch.Generator().manual_seed(0)
    out = {way: {} for way in WAYS}
    for length in lengths:
        ids = torch.randint(min(100, target.vocab_size - 1), target.vocab_size, (length,), generator=gen).tolist()
        times = {way: [] for way in WAYS}
        for repeat in range(repeats + 1):
            for way, native in WAYS.items():
                elapsed = prefill_ms(target, ids, native)
                if repeat:
                    times[way].append(elapsed)
        for way in WAYS:
            out[way][length] = round(statistics.median(times[way]), 1)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[40, 200, 600])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    target = load_target(TargetConfig(quant="q4"))
    lean = getattr(target, "lean", None)
    if lean is None or lean.native is None:
        raise SystemExit("this target's forward does not run through the native step (a q4 target on a CPU does)")
    chosen = lean.native_prefill
    result = {"activations": lean.native.ACTIVATIONS, "native_prefill_chosen": chosen, "repeats": args.repeats,
              "ms": compare(target, args.lengths, args.repeats)}
    lean.native_prefill = chosen
    print_and_save(result, args.out)


if __name__ == "__main__":
    main()
