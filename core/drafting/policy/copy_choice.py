"""Which copy a round verifies, and how much of it: each free source's copy cut where it pays at its measured
acceptance (rates.LookupRates), the best of them, and App. D's trie with copies (a copy try: two copies that differ at
their first token verified together). Pure functions of the copies, the measured rates and the cost curves."""
from __future__ import annotations

from core.drafting.base import Copy, Draft, lookup_plan
from core.drafting.policy.cut import EMPTY, best_cut, expected_tokens, extend_cut
from core.drafting.policy.rates import LookupRates


def cut_copy(copy: Copy, k: int, rates: LookupRates, verify_cost: tuple[float, ...]) -> tuple[int, float]:
    """(how many of a copy's tokens to verify, the expected tokens per unit of verify cost of that prefix): with a
    cost curve, the prefix that pays at the measured acceptance of its source and key (best_cut); without one, a
    strong match whole (lookup_plan), else nothing (the value then 1.0: not weighed)."""
    if not verify_cost:
        alone, _ = lookup_plan(copy.tokens, copy.matched, rates.strong)
        return (min(len(copy.tokens), k) if alone else 0), 1.0
    return best_cut(rates.rates(copy.key, copy.source, min(len(copy.tokens), k), prior=copy.prior), verify_cost)


def best_try(copies: tuple[Copy, ...], cuts: list[int], k: int, rates: LookupRates,
             try_cost: tuple[float, ...]) -> tuple[Draft | None, float]:
    """App. D's trie with copied drafts: one copy (cut where it pays alone, else to its first token) and, as a
    second branch, another copy whose first token differs, cut where the pair's expected tokens per unit of cost
    peak (the second's acceptance as measured beside a first; the cost as copy tries measured it). At most one of
    the two first tokens is the target's (at T > 0 the target draws one token, core.verification.tree.walk), so the
    second branch adds its expected tokens to the first's. -> (the best such draft, its expected tokens per unit of
    verify cost), (None, 0.0) where no pair fits in k nodes."""
    best, best_value = None, 0.0
    for main, n in zip(copies, cuts):
        n = max(n, 1)
        if n >= k:
            continue
        expected = expected_tokens(rates.rates(main.key, main.source, n, prior=main.prior), try_cost)[-1]
        for other in copies:
            if other.tokens[0] == main.tokens[0]:
                continue
            other_rates = rates.rates(other.key, other.source, min(len(other.tokens), k - n), True)
            m, value = extend_cut(expected, 1 + n, other_rates, try_cost)
            if m and value > best_value:
                best, best_value = Draft(main.tokens[:n], None, alternatives=(tuple(other.tokens[:m]),),
                                         lookup_match=main.key, lookup_source=main.source,
                                         beside=(other.source, other.key)), value
    return best, best_value


def best_copy(copies: tuple[Copy, ...], k: int, rates: LookupRates, verify_cost: tuple[float, ...],
              try_cost: tuple[float, ...] = ()) -> Draft:
    """Of the free sources' copies, the cut one with the most expected tokens per unit of verify cost (the first that
    keeps something without a cost curve), or a copy try where one beats it (try_cost: copy tries' cost curve; ():
    no tries); an empty draft when none pays."""
    best, best_value, best_n = None, 1.0, 0  # a plain step: one token for one step's cost
    cuts = []
    for copy in copies:
        n, value = cut_copy(copy, k, rates, verify_cost)
        cuts.append(n)
        if n == 0:
            continue
        if not verify_cost:
            return copy.draft(n)
        if value > best_value:
            best, best_value, best_n = copy, value, n
    if try_cost and len(copies) > 1:
        tried, value = best_try(copies, cuts, k, rates, try_cost)
        if tried is not None and value > best_value:
            return tried
    return EMPTY if best is None else best.draft(best_n)
