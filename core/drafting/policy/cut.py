"""How much of a draft to verify: the prefix with the most expected committed tokens per unit of this machine's
verify cost (core.runtime.verify_cost), from the slots' confidence as their acceptance estimate; with a bound on the
tokens the cut may give up (RunSpec.max_lost), at least the shortest prefix whose expected tokens fall short of the
whole draft's by no more than it. Pure functions on Python floats: a cut runs every drafting round, where a dozen
tensor ops on a few slots would cost ~5% of a step. Whatever length they pick, verification keeps the output exact.

Shape letters: K = drafted block length."""
from __future__ import annotations

from dataclasses import replace

import torch

from core.drafting.base import Draft

EMPTY = Draft(torch.empty(0, dtype=torch.long), None)  # a plain step's draft


def expected_tokens(confidence, verify_cost: tuple[float, ...]) -> list[float]:
    """Expected committed tokens of verifying the first n slots, n = 0..min(K, len(verify_cost) - 1):
    1 + sum_{k<=n} prod_{j<=k} c_j, with the drafter's per-slot confidence c (K,) as its acceptance estimate."""
    values = confidence.tolist() if isinstance(confidence, torch.Tensor) else list(confidence)
    expected, reach = [1.0], 1.0
    for c in values[: len(verify_cost) - 1]:
        reach *= min(max(c, 0.0), 1.0)  # P(slots 1..k all accepted)
        expected.append(expected[-1] + reach)
    return expected


def best_cut(confidence, verify_cost: tuple[float, ...]) -> tuple[int, float]:
    """(the prefix length n maximising expected committed tokens per unit of verify cost,
    (1 + sum_{k<=n} prod_{j<=k} c_j) / cost(n + 1 positions); that maximum), the first n on a tie, 0 where no prefix
    beats a plain step."""
    values = confidence.tolist() if isinstance(confidence, torch.Tensor) else confidence
    plain = 1.0 / verify_cost[0]  # the anchor alone: one token for one position
    best_n, best_value = extend_cut(1.0, 1, values, verify_cost)
    return (best_n, best_value) if best_value > plain else (0, plain)


def extend_cut(expected: float, fed: int, confidence: list[float], verify_cost: tuple[float, ...]) -> tuple[int, float]:
    """Slots beside what already feeds `fed` positions for `expected` tokens: (the length m with the most
    expected tokens per unit of verify cost of fed + m positions, the first on a tie; that maximum), (0, 0.0) where
    none fits the curve. After the anchor alone (fed 1, expected 1) it is a chain's cut (best_cut); beside a draft,
    a copy try's second branch, whose tokens are kept only where the draft's first is not, so their expected tokens
    add."""
    best_m, best_value, reach = 0, 0.0, 1.0
    for m, c in enumerate(confidence[: len(verify_cost) - fed], start=1):
        reach *= min(max(c, 0.0), 1.0)  # P(the branch's slots 1..m all accepted)
        expected += reach
        if expected / verify_cost[fed + m - 1] > best_value:
            best_m, best_value = m, expected / verify_cost[fed + m - 1]
    return best_m, best_value


def within_loss(confidence, verify_cost: tuple[float, ...], max_lost: float) -> int:
    """The shortest prefix n whose expected committed tokens fall short of verifying every slot the curve holds by at
    most max_lost: expected(all) - expected(n) = sum_{k>n} prod_{j<=k} c_j <= max_lost. With calibrated confidences
    that bounds the acceptance a round gives up against the whole draft's."""
    expected = expected_tokens(confidence, verify_cost)
    return next(n for n, tokens in enumerate(expected) if expected[-1] - tokens <= max_lost)


def best_draft_length(confidence, verify_cost: tuple[float, ...], max_lost: float = 0.0) -> int:
    """The prefix length n maximising expected committed tokens per unit of verify cost (best_cut); with max_lost > 0
    at least within_loss's n, so the cut gives up at most max_lost expected tokens a round (0: no such bound)."""
    n = best_cut(confidence, verify_cost)[0]
    return max(n, within_loss(confidence, verify_cost, max_lost)) if max_lost > 0 else n


def draft_pays(confidence, verify_cost: tuple[float, ...], draft_cost: float) -> bool:
    """Whether drafting beats a plain step in expected tokens per unit of cost when the drafter's own call is paid
    too: max over n >= 1 of (1 + sum_{k<=n} prod_{j<=k} c_j) / (cost(n + 1) + draft_cost) > 1 / cost(1) = 1.
    With draft_cost = 0 this is "the cut keeps something" (best_draft_length > 0). The draft in hand is sunk, so
    its cut ignores draft_cost; this only tells the skips whether the next call is likely worth making."""
    expected = expected_tokens(confidence, verify_cost)
    return any(tokens / (cost + draft_cost) > 1.0 for tokens, cost in zip(expected[1:], verify_cost[1:]))


def clip_draft(draft: Draft | None, k: int, verify_cost: tuple[float, ...] = (), max_lost: float = 0.0) -> Draft:
    """No draft -> an empty one; a drafter that overshoots the room left is cut to k slots; with a cost
    curve, a draft with confidences is cut to its best expected length (best_draft_length, max_lost its bound).
    (Alternatives are cut by the trie's node budget, core.decoding.engine.round_trie.)"""
    if draft is None:
        return EMPTY
    if verify_cost and draft.confidence is not None:
        k = min(k, best_draft_length(draft.confidence, verify_cost, max_lost))
    if len(draft.tokens) <= k:
        return draft
    cut = lambda x: None if x is None else x[:k]  # noqa: E731
    return replace(draft, tokens=draft.tokens[:k], q_draft=cut(draft.q_draft), confidence=cut(draft.confidence))
