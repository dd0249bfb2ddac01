"""What one call of a release-format FlashMap drafter costs on this CPU, by implementation of its DiT: op by op in
torch, the native trunk in fp32 and with 8-bit products (drafter.runtime.native_trunk.ReleaseTrunk); and its greedy
confidence (the top probability of 16 rows of the vocabulary) through torch's ops and the native kernel
(core.verification.sampling.top_probs). The arms alternate within each repeat, after the same context, so drift on a
noisy machine hits them alike; medians of milliseconds, ratios to torch's.

python -m lab.release_call --weights weights/smollm2-135m-instruct/flashmap-release --out FILE.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from core.runtime.target import TargetConfig, load_target
from core.runtime.threads import apply_thread_policy
from core.verification import sampling
from core.verification.sampling import SamplingConfig
from drafter.formats.release import load_release_net
from drafter.runtime.release import ReleaseDrafter
from lab.harness import print_and_save

ARMS = {"torch": dict(native=False), "native fp32": dict(products="fp32"), "native 8-bit": dict(products="8-bit")}


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", required=True, help="a release-format folder for the embedded target")
    parser.add_argument("--context", type=int, default=300, help="committed positions before the anchor")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20, help="calls timed per arm and repeat")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    apply_thread_policy(args.threads)
    target = load_target(TargetConfig())
    net = load_release_net(args.weights, target)
    drafters = {name: ReleaseDrafter(net, target, **kwargs) for name, kwargs in ARMS.items()}
    features = torch.randn(args.context, len(net.c.target_layer_ids) * target.model.config.hidden_size,
                           generator=torch.Generator().manual_seed(0))  # (N, F)
    for drafter in drafters.values():
        drafter.extend(list(range(args.context)), features)
    greedy, gen = SamplingConfig(), torch.Generator().manual_seed(1)
    logits = drafters["torch"].logits(5, generator=gen)  # (K, V): the confidence's input
    kernels = sampling.kernels()
    confidence = {"torch": lambda: torch.exp(logits.max(-1).values - logits.logsumexp(-1)),
                  "native": lambda: kernels.top_probs(logits)} if kernels is not None else {}
    ms: dict[str, list[float]] = {}
    for blocks in (16, 4):
        for name, drafter in drafters.items():
            drafter.propose(5, blocks, greedy, gen)  # warm-up
    for _ in range(args.repeats):
        for blocks in (16, 4):
            for name, drafter in drafters.items():
                def call(drafter=drafter, blocks=blocks):
                    for _ in range(args.calls):
                        drafter.propose(5, blocks, greedy, gen)
                ms.setdefault(f"{name}, {blocks} rows", []).append(statistics.mean(timed(call, 1)) / args.calls)
        for name, fn in confidence.items():
            ms.setdefault(f"confidence {name}", []).append(statistics.median(timed(fn, args.calls)))
    result = {"command": "python -m lab.release_call " + " ".join(argv), "threads": args.threads,
              "context": args.context, "precision": target.precision,
              "trunk": {name: drafter.trunk_status for name, drafter in drafters.items()}, **summary(ms)}
    print_and_save(result, args.out)


def summary(ms: dict[str, list[float]]) -> dict:
    """Medians of each arm's milliseconds ("ARM, N rows" and "confidence ARM"), and each one's ratio to torch's."""
    medians = {name: statistics.median(values) for name, values in ms.items()}
    ratios = {}
    for name, value in medians.items():
        reference = "confidence torch" if name.startswith("confidence") else "torch," + name.partition(",")[2]
        ratios[name] = value / medians[reference]
    return {"ms": medians, "of_torch": ratios}


if __name__ == "__main__":
    main()
