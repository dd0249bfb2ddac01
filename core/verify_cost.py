"""The verify cost curve: time of one target forward over T = 1, 2, 4, 8, 16, 17 new positions
after a context of C cached positions. It bounds every speedup: a round that commits gamma tokens
costs draft + verify(K+1), against gamma plain forwards of verify(1).

python -m core.verify_cost [--cached 256] [--repeats 20] [--target ID] [--out FILE.json] [--compare-cpu-linear]

--compare-cpu-linear times the target with both CPU linear kernels (core.cpu_linear: prepacked oneDNN, torch's
own) in one run, their passes interleaved so that load on the machine hits both alike.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import torch

from core import native
from core.drafting import MAX_BLOCK_SIZE
from core.forward import keep_positions, target_forward
from core.sampling import SamplingConfig
from core.target import CPU_LINEARS, add_target_args, load_target, target_config_from_args

POSITIONS = (1, 2, 4, 8, 16, 17)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_passes(target, context: int, repeats: int, positions=POSITIONS) -> Iterator[dict[int, list[float]]]:
    """Seconds of one forward over T new positions after `context` cached ones, T values interleaved, one pass over
    all of them at a time: yields the times so far after each pass (the first, a warm-up, is not timed), so a
    caller can hand the model to others between passes."""
    gen = torch.Generator().manual_seed(0)

    def draw(n: int) -> list[int]:
        return torch.randint(min(100, target.vocab_size - 1), target.vocab_size, (n,), generator=gen).tolist()

    cache = target.new_cache(context + max(positions) + 1)
    times: dict[int, list[float]] = {t: [] for t in positions}
    with torch.inference_mode():
        target_forward(target, draw(context), cache, ())
    for repeat in range(repeats + 1):
        with torch.inference_mode():  # entered per pass: a suspended generator must not leave the caller in it
            for t in positions:
                block = draw(t)
                elapsed = _seconds(target.device, lambda: target_forward(target, block, cache, ()))
                if repeat:
                    times[t].append(elapsed)
                keep_positions(cache, t, [])  # drop them all
        if repeat:
            yield times


def verify_cost(target, context: int, repeats: int, positions=POSITIONS) -> dict[int, float]:
    """Median seconds of one forward over T new positions; T values interleaved across repeats."""
    return interleaved_costs({"target": target}, context, repeats, positions)["target"]


def interleaved_costs(targets: dict, context: int, repeats: int, positions=POSITIONS) -> dict[str, dict[int, float]]:
    """verify_cost for several loaded targets, one pass of each in turn: {name: {T: median seconds}}."""
    passes = {name: timed_passes(target, context, repeats, positions) for name, target in targets.items()}
    times = {}
    for _ in range(repeats):
        for name, timed in passes.items():
            times[name] = next(timed)
    return {name: {t: statistics.median(v) for t, v in per_t.items()} for name, per_t in times.items()}


def draft_cost(target, drafter, context: int = 256, repeats: int = 10) -> float:
    """One drafter call (a whole block at T = 0 after `context` positions) relative to a one-position target forward,
    medians, the two interleaved so that load on the machine hits both alike: what core.policy.draft_pays charges a
    draft for the drafter's own time. Leaves the drafter reset."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(min(100, target.vocab_size - 1), target.vocab_size, (context + repeats + 1,), generator=gen)
    ids = ids.tolist()
    cache = target.new_cache(context + repeats + 2)
    greedy = SamplingConfig(temperature=0.0)
    forward_s, propose_s, block = [], [], drafter.max_block_size
    with torch.inference_mode():
        _, features = target_forward(target, ids[:context], cache, drafter.feature_layers)
        drafter.reset()
        drafter.extend(ids[:context], features)
        for repeat in range(repeats + 1):  # the first of each, a warm-up, is not timed
            step = [ids[context + repeat]]
            forward_s.append(_seconds(target.device, lambda: target_forward(target, step, cache, ())))
            keep_positions(cache, 1, [])
            propose_s.append(_seconds(target.device, lambda: drafter.propose(ids[context], block, greedy, gen)))
    drafter.reset()
    return statistics.median(propose_s[1:]) / statistics.median(forward_s[1:])


def _seconds(device: torch.device, work) -> float:
    """Wall seconds of work(); CUDA runs asynchronously, so time the work, not its launch."""
    synchronize(device)
    start = time.perf_counter()
    work()
    synchronize(device)
    return time.perf_counter() - start


def relative_from(times: dict[int, list[float]]) -> tuple[float, ...]:
    """The relative curve from per-T timings (medians), made sane."""
    median = {t: statistics.median(v) for t, v in times.items()}
    return sane_curve(tuple(median[t] / median[1] for t in sorted(median)))


def relative_curve(target, max_positions: int = MAX_BLOCK_SIZE + 1, context: int = 256,
                   repeats: int = 5) -> tuple[float, ...]:
    """Cost of 1..max_positions new positions relative to one, measured now on this machine (a few seconds), made
    sane (sane_curve); what the adaptive draft length (core.policy.best_draft_length) reads."""
    for times in timed_passes(target, context, repeats, range(1, max_positions + 1)):
        pass
    return relative_from(times)


def sane_curve(curve) -> tuple[float, ...]:
    """A measured relative curve within physical bounds: one position costs 1, and n positions at least one
    position's forward and at most n of them. Not smoothed: a CPU's curve is not monotone (here, with oneDNN's
    prepacked kernels, 2 positions cost 1.2x one and 4 the same as one; with torch's MKL 1.6x and 1.4x), and the
    adaptive cut should see it as it is. Load spikes are what the per-position median over passes removes."""
    return tuple(1.0 if n == 1 else min(max(float(cost), 1.0), float(n)) for n, cost in enumerate(curve, start=1))


def machine_key(target) -> str:
    """What a cost curve depends on: this machine, its thread count, the target and how it is loaded."""
    return "|".join([platform.node(), platform.machine(), platform.processor(), str(torch.get_num_threads()),
                     target.identity["name"], str(target.model.dtype), str(target.device),
                     f"packed={target.extra.get('packed_linears', 0)}",  # oneDNN's curve is far flatter
                     target.precision,  # the forward (lean or not, its weights) shapes the curve too
                     f"native={native.forward_build(target)}"])


def cache_file(root: Path, target) -> Path:
    return Path(root) / f"verify-cost-{hashlib.sha1(machine_key(target).encode()).hexdigest()[:12]}.json"


def load_cached(root: Path, target) -> tuple[tuple[float, ...], float] | None:
    """(curve, measured at: time.time()) from an earlier run on this machine with this target, or None."""
    path = cache_file(root, target)
    try:
        data = json.loads(path.read_text())
        if data["key"] != machine_key(target):
            return None
        return sane_curve(data["curve"]), float(data["measured_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: measure again


def save_cached(root: Path, target, curve: tuple[float, ...]) -> None:
    path = cache_file(root, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": machine_key(target), "curve": list(curve), "measured_at": time.time()}))
    tmp.replace(path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cached", type=int, default=256, help="positions already in the KV cache")
    parser.add_argument("--repeats", type=int, default=20, help="timed passes over the T values (median)")
    parser.add_argument("--positions", type=int, nargs="+", default=list(POSITIONS), help="T values to time")
    parser.add_argument("--out", default=None, help="also write the JSON result here")
    parser.add_argument("--compare-cpu-linear", action="store_true",
                        help="time both CPU linear kernels (onednn, torch) side by side, passes interleaved")
    add_target_args(parser)
    args = parser.parse_args(argv)
    kernels = CPU_LINEARS if args.compare_cpu_linear else (args.cpu_linear,)
    cfg = target_config_from_args(args)
    targets = {kernel: load_target(replace(cfg, cpu_linear=kernel)) for kernel in kernels}
    costs = interleaved_costs(targets, args.cached, args.repeats, sorted(set(args.positions) | {1}))
    curves = {kernel: {"seconds": cost, "relative_to_one": {t: s / cost[1] for t, s in cost.items()}}
              for kernel, cost in costs.items()}
    first = targets[kernels[0]]
    result = {"target": first.name, "context": args.cached, "repeats": args.repeats,
              "threads": torch.get_num_threads(),
              **(curves[kernels[0]] if len(kernels) == 1 else {"cpu_linear": curves})}
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
