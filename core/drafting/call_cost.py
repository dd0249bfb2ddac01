"""What one call of a drafter costs beside the target's own step, measured on this machine: the charge the skip policy
puts on each draft (core.drafting.policy.policy.DraftPolicy.call_cost)."""
from __future__ import annotations

import statistics

import torch

from core.runtime.forward import keep_positions, target_forward
from core.runtime.verify_cost import random_ids, timed_seconds
from core.verification.sampling import SamplingConfig


def draft_cost(target, drafter, context: int = 256, repeats: int = 10) -> float:
    """One drafter call (a whole block at T = 0 after `context` positions) relative to a one-position target forward,
    medians, the two interleaved so that load on the machine hits both alike: what the policy charges a draft for the
    drafter's own time (core.drafting.policy.policy.DraftPolicy.call_cost). Leaves the drafter reset."""
    gen = torch.Generator().manual_seed(0)
    ids = random_ids(target, context + repeats + 1, gen)
    cache = target.new_cache(context + repeats + 2)
    greedy = SamplingConfig(temperature=0.0)
    forward_s, propose_s, block = [], [], drafter.max_block_size
    with torch.inference_mode():
        _, features = target_forward(target, ids[:context], cache, drafter.feature_layers)
        drafter.reset()
        drafter.extend(ids[:context], features)
        for repeat in range(repeats + 1):  # the first of each, a warm-up, is not timed
            step = [ids[context + repeat]]
            forward_s.append(timed_seconds(target.device, lambda: target_forward(target, step, cache, ())))
            keep_positions(cache, 1, [])
            propose_s.append(timed_seconds(target.device, lambda: drafter.propose(ids[context], block, greedy, gen)))
    drafter.reset()
    return statistics.median(propose_s[1:]) / statistics.median(forward_s[1:])
