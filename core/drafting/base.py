"""The drafter interface the engine calls, and the n-gram (prompt-lookup) drafter.

Shape letters: K = block size, V = target vocabulary, N = newly committed positions,
F = concatenated feature width (len(feature_layers) * D, D = target hidden size).

A drafter is told what the target committed (`extend`, with the target's hidden states at the
layers it asked for) and asked for a block (`propose`). Everything a FlashMap or DFlash drafter
needs arrives through these two calls: context features for every committed position before the
anchor, and the anchor token itself (paper §3.1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import torch

from core.drafting.phrasebook import Phrasebook
from core.drafting.policy.config import DEFAULTS
from core.runtime.lean import MAX_BLOCK_SIZE  # (the drafters' limit on K is the engine's)
from core.verification.sampling import SamplingConfig

COPIED = ("lookup", "phrasebook", "tail")  # the free sources' names (Draft.lookup_source, Copy.source)


@dataclass(frozen=True)
class Draft:
    # (K,) target vocabulary ids: a long tensor (a network's draft), or a list of ints (a copied draft, which never
    # needs a tensor: making one after a forward cost most of what deciding on a copy costs, docs/journal/engine.md)
    tokens: torch.Tensor | list[int]
    q_draft: torch.Tensor | None  # (K, V) proposal probabilities, or None for a deterministic drafter
    # (K,) per-slot confidence for the adaptive length; must not depend on the sampled tokens (a cut that looks
    # at the sampled values biases the output at T > 0), e.g. the largest probability of each slot's distribution
    confidence: torch.Tensor | None = None
    # further drafts from independent noise draws (paper App. D), target ids each; the engine merges them with
    # `tokens` into a trie and verifies it as a tree, exactly at every temperature (core.verification.tree.walk)
    alternatives: tuple[tuple[int, ...], ...] = ()
    # a copied draft (LookupHybrid.propose_lookups): the key the policy's measured acceptance is kept by
    # (core.drafting.policy.state.Acceptance; Copy.key: the matched suffix's length, or a phrasebook copy's grade);
    # 0 for every other draft
    lookup_match: int = 0
    # where a copied draft comes from: "lookup" (earlier in the conversation) or "phrasebook" (the target's own
    # replies to other prompts, core.drafting.phrasebook); the round's source in its event
    lookup_source: str = "lookup"
    # a copy joined as an alternative beside the network's draft (LookupHybrid.propose): where it comes from, "lookup"
    # or "phrasebook"; "" where no alternative is a copy
    branch_source: str = ""

    @cached_property
    def ids(self) -> list[int]:
        """`tokens` as Python ints (K,), made once: the engine reads them several times a round, and after a forward
        each tensor's tolist() is dear (its code and data come back from memory; docs/journal/engine.md)."""
        return self.tokens if isinstance(self.tokens, list) else self.tokens.tolist()

    @property
    def source(self) -> str:
        """What it verifies: "plain" (nothing), a copy's source (COPIED: no network call) or "drafter"."""
        return "plain" if len(self.tokens) == 0 else self.lookup_source if self.lookup_match else "drafter"

    @property
    def shown_source(self) -> str:
        """`source` as the round's event says it: a copy joined beside an empty network draft is that copy's round."""
        return self.branch_source if len(self.tokens) == 0 and self.branch_source else self.source


@dataclass(frozen=True)
class Copy:
    """A free source's copied continuation, before the policy decides on it (LookupHybrid.propose_lookups): plain
    Python, since most are cut to nothing and a Draft's tensors cost more than deciding (docs/journal/engine.md)."""

    tokens: list[int]  # (<=K,) target ids
    matched: int  # the length of the matched suffix it copies after (the tail's: its first slot's confidence, 1..5)
    source: str = "lookup"  # "lookup" (the conversation) or "phrasebook" (Draft.lookup_source)
    prior: tuple[float, ...] = ()  # each slot's expected acceptance before this conversation measures it, if known
    # what its acceptance is measured by where more than `matched` (core.drafting.phrasebook.grade)
    grade: int | None = None

    @property
    def key(self) -> int:
        """The key its acceptance is measured by (core.drafting.policy.state.Acceptance; Draft.lookup_match)."""
        return self.matched if self.grade is None else self.grade

    def draft(self, n: int) -> Draft:
        """Its first n tokens as the round's draft, a list (no confidence: the policy keeps its measured rates)."""
        return Draft(self.tokens[:n], None, lookup_match=self.key, lookup_source=self.source)  # (n,)


class Drafter(Protocol):
    name: str
    feature_layers: tuple[int, ...]  # indices into the target's hidden_states tuple (0 = embeddings)
    max_block_size: int  # the largest block it can propose (K it was trained for); the engine never asks for more
    # optional: the committed positions before the anchor whose features a proposal reads (a network's context
    # window); for such a drafter the engine captures features only around the rounds that could call the network
    # (core.drafting.policy.policy.FeatureCapture). Absent or None: every position's features are captured
    context_window: int | None

    def reset(self) -> None:
        """Forget the previous generation."""

    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        """Committed tokens (N,) whose target hidden states are known, with the features (M, F) of the last M of them
        (M = N but where the engine captured none for earlier positions), or None where it captured none."""

    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        """A block of up to `block_size` tokens that would follow `anchor`; may be empty."""


class NoNetwork:
    """No network beside the free sources (LookupHybrid(NoNetwork(K)): the app's Copies choice): it reads no
    features and proposes an empty block wherever the policy asks it for one, which the round then verifies as a
    plain step."""

    name = "none"
    feature_layers: tuple[int, ...] = ()
    context_window: int | None = None

    def __init__(self, max_block_size: int = MAX_BLOCK_SIZE):
        self.max_block_size = max_block_size

    def reset(self) -> None:
        pass

    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        pass

    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        return Draft(torch.empty(0, dtype=torch.long), None)


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the current suffix, copy what followed.

    Deterministic (q = None), needs no features and no training. Every n-gram's latest start is indexed as tokens
    arrive, so a lookup is a few dictionary reads, not a scan of the conversation, which grows with it
    (docs/journal/engine.md).
    """

    name = "ngram"
    feature_layers: tuple[int, ...] = ()
    max_block_size = MAX_BLOCK_SIZE  # copies any length; the engine's own limit
    context_window: int | None = None  # reads no features

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.reset()

    def reset(self) -> None:
        self.history: list[int] = []
        # n -> n-gram -> start of its latest occurrence followed by a token in history
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}

    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        for token in token_ids:
            end = len(self.history)  # the new token's position: every n-gram ending just before it is followed
            for n, index in self.latest.items():
                if end >= n:
                    index[tuple(self.history[end - n:end])] = end - n
            self.history.append(int(token))

    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        return Draft(torch.as_tensor(self.lookup(anchor, block_size)[0], dtype=torch.long), None)

    def lookup(self, anchor: int, block_size: int) -> tuple[list[int], int]:
        """(what followed the latest earlier occurrence of the longest matching suffix, at most block_size
        tokens; the length of that suffix), ([], 0) when nothing matches."""
        history, end = self.history, len(self.history)  # the sequence read is history + [anchor], never copied:
        # a copy of the whole conversation every round grew with it
        for n in range(min(self.max_ngram, end), self.min_ngram - 1, -1):
            suffix = (*history[end - n + 1 :], anchor)  # (n,) the anchor is the suffix's last token
            start: int | None = end - n  # the occurrence ending at history's last token, followed by the anchor
            if tuple(history[end - n:end]) != suffix:
                start = self.latest[n].get(suffix)
            if start is not None:
                copied = history[start + n : start + n + block_size]  # (<=K,)
                if start + n + block_size > end:  # the copy runs up to the anchor itself
                    copied.append(anchor)
                return copied, n
        return [], 0




def lookup_plan(copied: list[int], matched: int, strong: int = DEFAULTS.lookup_strong,
                branch: int = DEFAULTS.lookup_branch) -> tuple[bool, tuple[int, ...]]:
    """What a round without a cost curve does with a lookup (copied continuation, matched suffix length): (verify it
    alone without calling the drafter, the tokens it contributes: all of them, or the first `branch` as one more
    trie branch). With a cost curve the policy cuts every lookup by its measured acceptance instead."""
    if matched >= strong and len(copied) >= branch:
        return True, tuple(copied)
    return False, tuple(copied[:branch])


@dataclass
class BlockTail:
    """What is left of the network's last block once a round has verified part of it: the network drafts a whole block
    (16 slots) and the policy verifies the prefix that pays for its rows, so when the target kept that prefix and its
    own next token is the block's next slot too, the slots after it are still the network's draft for the next
    round, at no call. Follows the committed tokens only (and the drafter's own noise, which the target's sampling
    never reads), so offering the tail is a policy choice: verification keeps the output exact at every temperature."""

    ahead: list[int] = field(default_factory=list)  # the block from the anchor it expects next on
    confidence: list[float] = field(default_factory=list)  # the network's per-slot confidence for ahead[1:]

    def drafted(self, anchor: int, tokens: list[int], confidence: list[float]) -> None:
        """The network's whole block after `anchor` (before the policy's cut), with its slots' confidence."""
        self.ahead, self.confidence = [anchor, *tokens], list(confidence)

    def extend(self, kept: list[int]) -> None:
        """A round kept [anchor, accepted drafts...]: the tail goes on where they are the block's next tokens."""
        n = len(kept)
        if self.ahead[:n] == kept:
            self.ahead, self.confidence = self.ahead[n:], self.confidence[n:]
        else:
            self.ahead, self.confidence = [], []

    def copy(self, anchor: int, block_size: int) -> Copy | None:
        """The tail after `anchor` when the block foresaw it, as a copy keyed by its first slot's confidence in fifths
        (1..5: the policy measures each bucket's acceptance, core.drafting.policy.state.Acceptance); None otherwise."""
        if len(self.ahead) < 2 or self.ahead[0] != anchor:
            return None
        first = self.confidence[0] if self.confidence else 0.0
        return Copy(self.ahead[1 : 1 + block_size], 1 + min(4, int(5 * first)), "tail")


class LookupHybrid:
    """A drafter with free sources beside its network: prompt lookup (the conversation) and, where the target has one,
    its phrasebook (core.drafting.phrasebook: what the target itself wrote after the same tokens in other replies), and
    the rest of the network's last block where the target kept its prefix (BlockTail); none costs a network call (App.
    D's trie with more sources). `propose_lookups` offers their copied continuations; the engine's policy takes the one
    that pays most in a round where one pays (core.drafting.policy: measured acceptance per source and match length, cut
    under the verify cost, a measured verdict against plain steps). Where the policy calls the network instead, at T = 0
    the first `branch` copied tokens (the conversation's, else the phrasebook's) join the network's block(s) as one more
    branch of the trie verified in the round; at T > 0, where a trie is not exact, the network's block goes alone. Every
    choice depends on committed tokens and past rounds only, never on the token being sampled, so the output stays
    exact."""

    def __init__(self, main: Drafter, branch: int = DEFAULTS.lookup_branch, phrasebook: Phrasebook | None = None):
        self.main, self.branch, self.phrasebook = main, branch, phrasebook
        self.ngram = NgramDrafter()
        self.tail = BlockTail()
        self.use_tail = True  # False: no tail copies (the comparisons that measure what they bring)
        self.name = f"{main.name}+lookup" + ("+phrasebook" if phrasebook is not None else "")
        self.feature_layers = main.feature_layers
        self.max_block_size = main.max_block_size
        self.context_window = getattr(main, "context_window", None)

    def reset(self) -> None:
        self.main.reset()
        self.ngram.reset()
        self.tail = BlockTail()

    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        self.main.extend(token_ids, features)
        self.ngram.extend(token_ids, None)
        self.tail.extend(token_ids)

    def propose_lookup(self, anchor: int, block_size: int) -> Copy | None:
        """What followed the latest earlier occurrence of the conversation's longest matching suffix (up to
        block_size tokens), with the match's length; None when nothing matches."""
        copied, matched = self.ngram.lookup(anchor, block_size)
        return Copy(copied, matched) if copied else None

    def phrase(self, anchor: int, block_size: int) -> tuple[list[int], int, int]:
        """(the phrasebook's continuation of the conversation's longest kept suffix, up to block_size tokens; the
        suffix's length; the copy's grade, core.drafting.phrasebook.grade), ([], 0, 0) without a phrasebook or a
        match."""
        if self.phrasebook is None:
            return [], 0, 0
        recent = self.ngram.history[-self.phrasebook.config.max_ngram :]  # (<=n,) all a lookup reads
        return self.phrasebook.graded(recent + [anchor], block_size)

    def propose_phrase(self, anchor: int, block_size: int) -> Copy | None:
        """The phrasebook's copy (phrase), keyed by its grade and carrying the book's calibration; None without one."""
        copied, matched, graded = self.phrase(anchor, block_size)
        if not copied or self.phrasebook is None:
            return None
        return Copy(copied, matched, "phrasebook", self.phrasebook.prior(graded), graded)

    def propose_lookups(self, anchor: int, block_size: int) -> tuple[Copy, ...]:
        """Every free source's copy for this round (the conversation's first, then the phrasebook's and the network's
        block tail), those that found something."""
        copies = (self.propose_lookup(anchor, block_size), self.propose_phrase(anchor, block_size),
                  self.tail.copy(anchor, block_size) if self.use_tail else None)
        return tuple(copy for copy in copies if copy is not None)

    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        draft = self.main.propose(anchor, block_size, sampling, generator)
        confidence = [] if draft.confidence is None else draft.confidence.tolist()
        self.tail.drafted(anchor, draft.ids, confidence)
        looked_up = self.ngram.lookup(anchor, block_size)[0]
        copied = looked_up or self.phrase(anchor, block_size)[0]
        branch = tuple(copied[: self.branch])
        if not sampling.greedy or not branch or draft.ids[: len(branch)] == list(branch):
            return draft
        return Draft(draft.tokens, draft.q_draft, draft.confidence, (*draft.alternatives, branch),
                     branch_source="lookup" if looked_up else "phrasebook")
