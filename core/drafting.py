"""The drafter interface the engine calls, and the n-gram (prompt-lookup) drafter.

Shape letters: K = block size, V = target vocabulary, N = newly committed positions,
F = concatenated feature width (len(feature_layers) * D, D = target hidden size).

A drafter is told what the target committed (`extend`, with the target's hidden states at the
layers it asked for) and asked for a block (`propose`). Everything a FlashMap or DFlash drafter
needs arrives through these two calls: context features for every committed position before the
anchor, and the anchor token itself (paper §3.1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from core.sampling import SamplingConfig

MAX_BLOCK_SIZE = 16  # the largest block K the engine verifies in one round (and the UI offers)


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor  # (K,) long, target vocabulary ids
    q_draft: torch.Tensor | None  # (K, V) proposal probabilities, or None for a deterministic drafter
    # (K,) per-slot confidence for the adaptive length; must not depend on the sampled tokens (a cut that looks
    # at the sampled values biases the output at T > 0), e.g. the largest probability of each slot's distribution
    confidence: torch.Tensor | None = None
    # further drafts from independent noise draws (paper App. D), target ids each; the engine merges them with
    # `tokens` into a trie and verifies it as a tree, exactly, at T=0 only
    alternatives: tuple[tuple[int, ...], ...] = ()


class Drafter(Protocol):
    name: str
    feature_layers: tuple[int, ...]  # indices into the target's hidden_states tuple (0 = embeddings)
    max_block_size: int  # the largest block it can propose (K it was trained for); the engine never asks for more

    def reset(self) -> None:
        """Forget the previous generation."""

    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        """Committed tokens (N,) whose target hidden states are known, with features (N, F) or None."""

    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        """A block of up to `block_size` tokens that would follow `anchor`; may be empty."""


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the current suffix, copy what followed.

    Deterministic (q = None), needs no features and no training.
    """

    name = "ngram"
    feature_layers: tuple[int, ...] = ()
    max_block_size = MAX_BLOCK_SIZE  # copies any length; the engine's own limit

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.history: list[int] = []

    def reset(self) -> None:
        self.history = []

    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        self.history.extend(int(t) for t in token_ids)

    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        seq = np.asarray(self.history + [anchor], dtype=np.int64)  # (L,)
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            start = latest_match(seq, n)
            if start is not None:
                follow = seq[start + n : start + n + block_size]  # (<=K,)
                return Draft(torch.as_tensor(follow, dtype=torch.long), None)
        return Draft(torch.empty(0, dtype=torch.long), None)


def latest_match(seq: np.ndarray, n: int) -> int | None:
    """Start of the latest earlier occurrence of seq's last n tokens that has a continuation."""
    windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # (L-n, n), excludes the suffix itself
    hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
    return int(hits[-1]) if hits.size else None
