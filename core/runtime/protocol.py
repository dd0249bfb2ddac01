"""What the engine calls of a target's forward, whichever object serves it: one Protocol that the lean forward
(core.runtime.lean.LeanForward) and its fixed-shape steps (core.runtime.graphs.GraphedSteps) both satisfy, so that a
type checker refuses a forward that lacks what the generate loop, the prefix cache or the drafters read of it.

Shape letters: T = positions fed, V = vocabulary, F = concatenated feature width.
"""
from __future__ import annotations

from typing import Protocol

import torch

from core.runtime.lean import StaticCache


class TargetForward(Protocol):
    """A forward over a static KV cache: called with ids (T,) after the cache's valid positions, it advances the cache
    by T and returns logits (T or keep, V) and the features at `layers` (T, F) or None."""

    @property
    def weights(self) -> str:
        """How its linears hold their weights ("packed", "q4", ...): part of the exactness key."""

    @property
    def native(self) -> object | None:
        """The compiled CPU step (core.runtime.native), or None."""

    @property
    def fixed_order(self) -> bool:
        """Whether attention sums in a fixed order (batch-invariant on the CPU)."""

    @property
    def native_prefill(self) -> bool:
        """Whether a prompt's prefill gives bit for bit what the steps give: a reused prefix is then exact."""

    @property
    def lm_head(self) -> torch.nn.Module:
        """The LM head it applies (a drafter that shares the target's head calls the same)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def new_cache(self, capacity: int) -> StaticCache: ...

    def __call__(self, ids: torch.Tensor | list[int], cache: StaticCache, layers: tuple[int, ...] = (), keep: int = 0,
                 block_visible: torch.Tensor | None = None, positions: torch.Tensor | list[int] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]: ...
