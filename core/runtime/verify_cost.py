"""The verify cost curve: time of one target forward over T = 1, 2, 4, 8, 16, 17 new positions
after a context of C cached positions. It bounds every speedup: a round that commits gamma tokens
costs draft + verify(K+1), against gamma plain forwards of verify(1). Measured from the command line by
`python -m lab.verify_cost`; the drafter's own call is timed by core.drafting.call_cost.
"""
from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from core.runtime import native
from core.runtime.forward import keep_positions, target_forward
from core.runtime.lean import MAX_BLOCK_SIZE, StaticCache

POSITIONS = (1, 2, 4, 8, 16, 17)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_ids(target, n: int, gen: torch.Generator) -> list[int]:
    """n token ids drawn from the target's vocabulary past its first 100 (specials and bytes)."""
    return torch.randint(min(100, target.vocab_size - 1), target.vocab_size, (n,), generator=gen,
                         device=gen.device).tolist()


def prefilled_cache(target, context: int, room: int):
    """A cache holding `context` random positions with room for `room` more."""
    cache = target.new_cache(context + room)
    with torch.inference_mode():
        target_forward(target, random_ids(target, context, torch.Generator().manual_seed(0)), cache, ())
    return cache


def timed_passes(target, context: int, repeats: int, positions=POSITIONS,
                 cache: StaticCache | None = None) -> Iterator[dict[int, list[float]]]:
    """Seconds of one forward over T new positions after `context` cached ones, T values interleaved, one pass over
    all of them at a time: yields the times so far after each pass (the first, a warm-up, is not timed), so a
    caller can hand the model to others between passes. cache: a static cache that already holds at least `context`
    positions, shared with passes after other contexts (each pass moves its index to `context`: the rows before it
    are a valid context); None: one of its own, prefilled here."""
    gen = torch.Generator().manual_seed(1)
    shared = cache is not None
    if cache is None:
        cache = prefilled_cache(target, context, max(positions) + 1)
    times: dict[int, list[float]] = {t: [] for t in positions}
    for repeat in range(repeats + 1):
        if shared:
            cache.length = context
        with torch.inference_mode():  # entered per pass: a suspended generator must not leave the caller in it
            for t in positions:
                block = random_ids(target, t, gen)
                elapsed = timed_seconds(target.device, lambda: target_forward(target, block, cache, ()))
                if repeat:
                    times[t].append(elapsed)
                keep_positions(cache, t, [])  # drop them all
        if repeat:
            yield times


def verify_cost(target, context: int, repeats: int, positions=POSITIONS) -> dict[int, float]:
    """Median seconds of one forward over T new positions; T values interleaved across repeats."""
    return interleaved_costs({"target": target}, context, repeats, positions)["target"]


def interleaved(passes: dict, repeats: int) -> Iterator[dict]:
    """One pass of each timed_passes generator in turn, `repeats` rounds, each round starting one key later: yields
    {key: {T: median seconds so far}} after every round, so a caller can hand the model to others in between. The
    rotation: the pass that opens a round reads slower (docs/journal/engine.md, "Measurements behind the
    code's rules")."""
    keys = list(passes)
    for round_index in range(repeats):
        first = round_index % len(keys)
        times = {key: next(passes[key]) for key in keys[first:] + keys[:first]}
        yield {key: {t: statistics.median(v) for t, v in times[key].items()} for key in keys}


def interleaved_costs(targets: dict, context: int, repeats: int, positions=POSITIONS) -> dict[str, dict[int, float]]:
    """verify_cost for several loaded targets, one pass of each in turn: {name: {T: median seconds}}."""
    passes = {name: timed_passes(target, context, repeats, positions) for name, target in targets.items()}
    for costs in interleaved(passes, repeats):
        pass
    return costs


def timed_seconds(device: torch.device, work) -> float:
    """Wall seconds of work(); CUDA runs asynchronously, so time the work, not its launch."""
    synchronize(device)
    start = time.perf_counter()
    work()
    synchronize(device)
    return time.perf_counter() - start


# the cached positions the curves are measured after: a short chat's and a long one's. Each new position attends to
# every cached one, so a verify's extra rows cost more in a longer conversation, and one curve measured after a short
# context under-prices a long chat's verified rows (docs/journal/engine.md, "Measurements behind the code's rules")
CONTEXTS = (256, 1024)


@dataclass(frozen=True)
class CostCurves:
    """The verify cost after several context lengths: seconds of one forward over 1..N new positions after each of
    `contexts` cached ones (medians). `at` gives the relative curve the adaptive cut reads for a reply."""

    contexts: tuple[int, ...]  # increasing
    seconds: tuple[tuple[float, ...], ...]  # per context: seconds of 1..N positions

    def __post_init__(self):
        if not self.contexts or len(self.contexts) != len(self.seconds) or list(self.contexts) != sorted(
                set(self.contexts)):
            raise ValueError("cost curves need increasing contexts, one row of seconds each")
        if len({len(row) for row in self.seconds}) != 1 or not all(s > 0 for row in self.seconds for s in row):
            raise ValueError("every context needs positive seconds for the same positions")

    def at(self, context: int) -> tuple[float, ...]:
        """The relative curve after `context` cached positions, made sane: each position count's seconds linear in
        the context between the two measured ones around it (a new row's attention is linear in the cached
        positions), extrapolated along the last two beyond the last, the first context's below it."""
        if len(self.contexts) == 1 or context <= self.contexts[0]:
            seconds = self.seconds[0]
        else:
            upper = next((i for i, c in enumerate(self.contexts) if c >= context), len(self.contexts) - 1)
            (c0, c1), (s0, s1) = self.contexts[upper - 1 : upper + 1], self.seconds[upper - 1 : upper + 1]
            share = (context - c0) / (c1 - c0)
            # past the last context, never below the smaller of the two measured (a noisy pair slopes down)
            seconds = tuple(max(a + share * (b - a), min(a, b)) for a, b in zip(s0, s1))
        return sane_curve(tuple(s / seconds[0] for s in seconds))

    def as_dict(self) -> dict:
        return {"contexts": list(self.contexts), "seconds": [list(row) for row in self.seconds]}

    @classmethod
    def from_dict(cls, data: dict) -> "CostCurves":
        return cls(tuple(data["contexts"]), tuple(tuple(row) for row in data["seconds"]))

    def for_reply(self, prompt_tokens: int, max_new_tokens: int) -> tuple[float, ...]:
        """The curve a reply's rounds meet on average: after its prompt and half its budget of new tokens."""
        return self.at(prompt_tokens + max_new_tokens // 2)


def fitting_contexts(target, contexts=CONTEXTS, max_positions: int = MAX_BLOCK_SIZE + 1) -> tuple[int, ...]:
    """The contexts a target's context window leaves room to measure after (a small test model's may hold none but
    the first, cut down to fit)."""
    room = target.max_positions - max_positions - 1
    return tuple(sorted({c for c in contexts if c <= room} or {max(1, min(contexts[0], room))}))


def curve_passes(target, repeats: int, contexts=CONTEXTS, max_positions: int = MAX_BLOCK_SIZE + 1):
    """timed_passes after each context, one pass of each in turn: yields the CostCurves so far after every round of
    passes (repeats of them), so a caller can hand the model to others in between."""
    contexts = fitting_contexts(target, contexts, max_positions)
    # on a static cache the contexts share one (the fixed-shape steps have only one), prefilled once for the longest
    shared = prefilled_cache(target, max(contexts), max_positions + 1) if target.lean is not None else None
    passes = {c: timed_passes(target, c, repeats, range(1, max_positions + 1), shared) for c in contexts}
    for costs in interleaved(passes, repeats):
        yield CostCurves(contexts, tuple(tuple(costs[c][t] for t in sorted(costs[c])) for c in contexts))


def cost_curves(target, repeats: int = 5, contexts=CONTEXTS) -> CostCurves:
    """CostCurves measured now on this machine (a few seconds a context)."""
    for curves in curve_passes(target, repeats, contexts):
        pass
    return curves


def sane_curve(curve) -> tuple[float, ...]:
    """A measured relative curve within physical bounds: one position costs 1, and n positions at least one position's
    forward and at most n of them. Not smoothed: a CPU's curve is not monotone (2 positions may cost more than 4,
    docs/journal/engine.md), and the adaptive cut should see it as it is. Load spikes are what the per-position median
    over passes removes."""
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


def load_cached(root: Path, target) -> tuple[CostCurves, float] | None:
    """(curves, measured at: time.time()) from an earlier run on this machine with this target, or None (also for a
    file from before the curves were measured per context: measured again)."""
    path = cache_file(root, target)
    try:
        data = json.loads(path.read_text())
        if data["key"] != machine_key(target):
            return None
        return CostCurves.from_dict(data), float(data["measured_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, unreadable or of the older format: measure again


def save_cached(root: Path, target, curves: CostCurves) -> None:
    path = cache_file(root, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": machine_key(target), **curves.as_dict(), "measured_at": time.time()}))
    tmp.replace(path)
