"""Reusing what the last reply left in the KV cache: a prompt that starts with the tokens of the previous prompt and
reply (the conversation's next turn, or any prompt under the same system prompt) prefills only what follows them.

Why: the app sends the whole conversation every turn, and one thread of the AVX2 EPYC prefills ~220 tokens a second,
so each turn of a long conversation waited again for every earlier one (the 6th turn of `python -m
scripts.first_token --turns 6`: 3.56 s to its first token, 0.24 s with the cache reused); llama.cpp keeps its previous
prompt's cache the same way.

Exact where the prefill is batch-invariant: through the native step (core.runtime.lean's native prefill) every
position's keys, values and hidden states are the same whether it was computed in a prefill chunk, a verify round or
alone, so a reused prefix is exactly what prefilling it again would give. Elsewhere (the op-by-op prefill's kernels pick
their order by shape) nothing is reused.

Shape letters: R = reused positions with features, M = kept positions with features, F = drafter feature width.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core.runtime.lean import StaticCache
from core.verification.tree import common_prefix


def reuses_prefixes(target) -> bool:
    """Whether this target's prefill is batch-invariant, so that a reused prefix equals a fresh prefill."""
    lean = getattr(target, "lean", None)
    return lean is not None and lean.native_prefill


@dataclass
class PrefixCache:
    """The token ids whose keys and values the last generation left in its cache, with that cache and the drafter
    features at `layers` of the last M of those positions ((M, F): all of them but where the generation captured none
    for a while, core.decoding.engine.captures; None without a drafter). One per conversation or run."""

    ids: list[int] = field(default_factory=list)
    cache: StaticCache | None = None
    features: torch.Tensor | None = None
    layers: tuple[int, ...] = ()

    def take(self, target, prompt_ids: list[int], layers: tuple[int, ...],
             capacity: int) -> tuple[StaticCache, int, torch.Tensor | None]:
        """A new cache of `capacity` positions holding the longest reusable prefix of prompt_ids (at least its last
        token is left to feed: its logits start the reply), the number of positions reused and the features kept for
        them (reused_features)."""
        cache = target.new_cache(capacity)
        if self.cache is None or not reuses_prefixes(target):  # (a target that reuses has a StaticCache)
            return cache, 0, None
        # features are reused too: a drafter needs the same layers' (a plain reply needs none)
        reused = common_prefix(self.ids, prompt_ids[:-1]) if not layers or self.layers == layers else 0
        if not reused:
            return cache, 0, None
        for dst, src in ((cache.keys, self.cache.keys), (cache.values, self.cache.values)):
            for new, old in zip(dst, src):  # (G, S, D) each layer
                new[:, :reused] = old[:, :reused]
        cache.length = reused
        return cache, reused, self.reused_features(reused) if layers else None

    def reused_features(self, reused: int) -> torch.Tensor | None:
        """The features of the first `reused` positions that were kept, up to the last of them: (R, F), those of
        positions reused - R .. reused - 1; None where the kept ones all lie after them (or none were kept)."""
        if self.features is None:
            return None
        start = len(self.ids) - self.features.shape[0]  # the first position with features
        return self.features[: reused - start] if reused > start else None

    def keep(self, ids: list[int], cache, features: torch.Tensor | None, layers: tuple[int, ...]) -> None:
        """After a generation: `ids` are the positions its cache holds (prompt and committed tokens but the last),
        `features` (M, F) those of the last M of them (core.decoding.engine.captures may have skipped earlier ones)."""
        self.ids, self.cache, self.features, self.layers = ids, cache, features, layers
