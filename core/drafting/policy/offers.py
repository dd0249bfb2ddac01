"""What a source offers a round (Offer: expected committed tokens for a cost in plain rounds), and the cut: the prefix
of a draft with the most expected tokens per unit of verify cost (core.runtime.verify_cost as the reply measures it),
its slots' acceptance c read as a chain, expected(n) = 1 + sum_{k<=n} prod_{j<=k} c_j. K = drafted block length."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from core.drafting.base import Copy, Draft, lookup_plan
from core.drafting.policy.state import Acceptance

EMPTY = Draft(torch.empty(0, dtype=torch.long), None)  # a plain step's draft


@dataclass(frozen=True)
class Offer:
    expected: float  # committed tokens
    cost: float  # in plain rounds
    draft: Draft = EMPTY  # what it verifies (the network's: drafted once its offer is taken)

    @property
    def value(self) -> float:
        return self.expected / self.cost


PLAIN = Offer(1.0, 1.0, EMPTY)


def expected_tokens(confidence, verify_cost: tuple[float, ...]) -> list[float]:
    """expected(n) for n = 0..min(K, len(verify_cost) - 1), confidence (K,) clamped to [0, 1]."""
    values = confidence.tolist() if isinstance(confidence, torch.Tensor) else confidence
    expected, reach = [1.0], 1.0
    for c in values[: len(verify_cost) - 1]:
        reach *= min(max(c, 0.0), 1.0)  # P(slots 1..k all accepted)
        expected.append(expected[-1] + reach)
    return expected


def best_cut(confidence, verify_cost: tuple[float, ...], call: float = 0.0) -> tuple[int, float]:
    """(the prefix n >= 1 with the most expected(n) / (cost(n + 1) + call), the first on a tie, and its expected
    tokens), or (0, 1.0) where none beats a plain step's 1 / cost(1). call: a network call not yet made; a draft in
    hand is sunk (0)."""
    best_n, best_expected, best_cost = 0, 1.0, verify_cost[0]
    for n, expected in enumerate(expected_tokens(confidence, verify_cost)[1:], start=1):
        if expected / (verify_cost[n] + call) > best_expected / best_cost:
            best_n, best_expected, best_cost = n, expected, verify_cost[n] + call
    return best_n, best_expected


def best_draft_length(confidence, verify_cost: tuple[float, ...], max_lost: float = 0.0) -> int:
    """best_cut's prefix; with max_lost > 0 at least the shortest prefix whose expected tokens fall short of all slots'
    by at most max_lost, which with calibrated confidences bounds what a round gives up (RunSpec.max_lost)."""
    n = best_cut(confidence, verify_cost)[0]
    if not max_lost:
        return n
    expected = expected_tokens(confidence, verify_cost)
    return max(n, next(m for m, tokens in enumerate(expected) if expected[-1] - tokens <= max_lost))


def clip_draft(draft: Draft | None, k: int, verify_cost: tuple[float, ...] = (), max_lost: float = 0.0) -> Draft:
    """At most k slots, with a cost curve and confidences best_draft_length's (alternatives: round_trie's budget)."""
    if draft is None:
        return EMPTY
    if verify_cost and draft.confidence is not None:
        k = min(k, best_draft_length(draft.confidence, verify_cost, max_lost))
    if len(draft.tokens) <= k:
        return draft
    cut = lambda x: None if x is None else x[:k]  # noqa: E731
    return replace(draft, tokens=draft.tokens[:k], q_draft=cut(draft.q_draft), confidence=cut(draft.confidence))


def copy_offer(copy: Copy, k: int, acceptance: Acceptance, verify_cost: tuple[float, ...]) -> Offer | None:
    """A copy's prefix cut where it pays at its measured acceptance (best_cut), if one does; without a cost curve a
    strong match whole (lookup_plan), any length counting as one plain round."""
    n = min(len(copy.tokens), k)
    rates = acceptance.rates(copy.source, copy.key, n, prior=copy.prior)
    if not verify_cost:
        alone, _ = lookup_plan(copy.tokens, copy.matched, acceptance.cfg.lookup_strong)
        return Offer(expected_tokens(rates, (1.0,) * (n + 1))[n], 1.0, copy.draft(n)) if alone else None
    n, expected = best_cut(rates, verify_cost)
    return Offer(expected, verify_cost[n], copy.draft(n)) if n else None


def best_copy(copies, k: int, acceptance: Acceptance, verify_cost: tuple[float, ...]) -> Offer | None:
    """Of the copies, the offer with the most tokens per unit of cost (the first on a tie), if one pays."""
    offers = (copy_offer(copy, k, acceptance, verify_cost) for copy in copies)
    return max((offer for offer in offers if offer is not None), key=lambda offer: offer.value, default=None)
