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
        return Draft(torch.as_tensor(self.lookup(anchor, block_size)[0], dtype=torch.long), None)

    def lookup(self, anchor: int, block_size: int) -> tuple[list[int], int]:
        """(what followed the latest earlier occurrence of the longest matching suffix, at most block_size
        tokens; the length of that suffix), ([], 0) when nothing matches."""
        seq = np.asarray(self.history + [anchor], dtype=np.int64)  # (L,)
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            start = latest_match(seq, n)
            if start is not None:
                return seq[start + n : start + n + block_size].tolist(), n  # (<=K,)
        return [], 0


LOOKUP_STRONG = 3  # a suffix of this many tokens matched ...
LOOKUP_BRANCH = 4  # ... with this many to copy: the lookup is proposed alone; else its first tokens join the trie


def lookup_plan(copied: list[int], matched: int, strong: int = LOOKUP_STRONG,
                branch: int = LOOKUP_BRANCH) -> tuple[bool, tuple[int, ...]]:
    """What a round does with a lookup (copied continuation, matched suffix length): (propose it alone without
    calling the drafter, the tokens it contributes: all of them, or the first `branch` as one more trie branch)."""
    if matched >= strong and len(copied) >= branch:
        return True, tuple(copied)
    return False, tuple(copied[:branch])


class LookupHybrid:
    """A drafter whose rounds also consult prompt lookup, which costs nothing to compute (App. D's trie with one
    more source). At T = 0 the lookup's continuation joins the drafter's block(s) as one more branch of the trie
    verified in the round, at most `branch` tokens long, and a strong lookup (a suffix of `strong` tokens or more
    matched, `branch` tokens or more to copy) is proposed alone, without calling the drafter. At T > 0, where a
    trie is not exact, a round takes one source: the strong lookup, else the drafter. Every choice depends on
    committed tokens only, never on the token being sampled, so the output stays exact."""

    def __init__(self, main: Drafter, strong: int = LOOKUP_STRONG, branch: int = LOOKUP_BRANCH):
        self.main, self.strong, self.branch = main, strong, branch
        self.ngram = NgramDrafter()
        self.name = f"{main.name}+lookup"
        self.feature_layers = main.feature_layers
        self.max_block_size = main.max_block_size

    def reset(self) -> None:
        self.main.reset()
        self.ngram.reset()

    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        self.main.extend(token_ids, features)
        self.ngram.extend(token_ids, None)

    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        alone, branch = lookup_plan(*self.ngram.lookup(anchor, block_size), self.strong, self.branch)
        if alone:  # the conversation repeats itself: copy it
            return Draft(torch.tensor(branch, dtype=torch.long), None)
        draft = self.main.propose(anchor, block_size, sampling, generator)
        if not sampling.greedy or not branch or draft.tokens.tolist()[: len(branch)] == list(branch):
            return draft
        return Draft(draft.tokens, draft.q_draft, draft.confidence, (*draft.alternatives, branch))


def latest_match(seq: np.ndarray, n: int) -> int | None:
    """Start of the latest earlier occurrence of seq's last n tokens that has a continuation."""
    windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # (L-n, n), excludes the suffix itself
    hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
    return int(hits[-1]) if hits.size else None
