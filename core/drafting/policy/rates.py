"""Measured acceptance, the slots' confidence for the cut: how often a copied token was kept, per source and key
(LookupRates), and how often the network's sampled drafts were kept at T > 0, per slot (SlotRates). Measured on this
conversation's own rounds, so a policy input like the timings: exact at every temperature."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core.drafting.policy.config import DEFAULTS


def smoothed_rate(accepted, reached, prior_rate: float, prior_weight: float):
    """accepted / reached with a Beta prior of weight prior_weight at prior_rate (floats or tensors alike)."""
    return (accepted + prior_rate * prior_weight) / (reached + prior_weight)


def count_slots(reached: list, accepted: list, n_verified: int, n_accepted: int) -> None:
    """Per-slot counts (in place) after a verified draft of n_verified tokens kept n_accepted: the slots up to the first
    rejection were reached, the first n_accepted of them kept."""
    grow = max(0, n_verified - len(reached))
    reached += [0.0] * grow
    accepted += [0.0] * grow
    for k in range(min(n_accepted + 1, n_verified)):
        reached[k] += 1
        accepted[k] += k < n_accepted


@dataclass
class LookupRates:
    """How often a copied token was accepted once verified, per source, key (prompt lookup's matched suffix of 1 up to
    `strong` tokens, longer matches copying more reliably; the phrasebook's grade; the block tail's confidence) and
    depth in the copy: slot k's tokens accepted over those verified with every earlier slot accepted, Beta-smoothed
    towards slot k - 1's rate (slot 1's towards prior_rate), or towards the copy's own prior where its source knows
    one (the phrasebook's calibration). Deeper copied tokens are kept more often than the first: once a copy is on its
    track it tends to stay there (docs/drafter.md, the phrasebook's check). At T > 0 it measures the acceptance
    p(token) of the copied tokens."""

    prior_rate: float = DEFAULTS.copy_prior
    prior_weight: float = DEFAULTS.prior_weight
    # a copy verified beside another whose first token differs (a copy try) is measured apart, from its own prior
    beside_prior: float = DEFAULTS.beside_prior
    strong: int = DEFAULTS.lookup_strong  # prompt lookup's matches are keyed up to this length
    reached: dict[tuple, list] = field(default_factory=dict)  # per key: per slot, copies verified that far
    accepted: dict[tuple, list] = field(default_factory=dict)  # per key: per slot, of those, how many kept it
    # per key: the slots' rates as last computed, until that key records again (most rounds offer copies under keys
    # that recorded nothing since)
    _rates: dict[tuple, list] = field(default_factory=dict, repr=False, compare=False)

    def key(self, matched: int, source: str = "lookup", beside: bool = False) -> tuple:
        key = (source, min(matched, self.strong) if source == "lookup" else matched)
        return (*key, "beside") if beside else key

    def rates(self, matched: int, source: str = "lookup", n: int = 1, beside: bool = False,
              prior: tuple[float, ...] = ()) -> list[float]:
        """The first n slots' acceptance, each given the earlier ones accepted (beside: as a copy try's second
        branch). prior: the slots' expected acceptance where the source knows it (a phrasebook's calibration for the
        copy's grade), which each slot is smoothed towards instead of the slot before it. The rates are kept per key
        until it records again, so a key is always read with the same prior (a grade's calibration is fixed)."""
        key = self.key(matched, source, beside)
        known = self._rates.get(key, [])
        if len(known) >= n:
            return known[:n]
        reached, accepted = self.reached.get(key, []), self.accepted.get(key, [])
        out, rate = [], self.beside_prior if beside else self.prior_rate
        for k in range(n):
            seen = reached[k] if k < len(reached) else 0.0
            start = prior[k] if k < len(prior) and not beside else rate
            rate = smoothed_rate(accepted[k] if k < len(accepted) else 0.0, seen, start, self.prior_weight)
            out.append(rate)
        self._rates[key] = out
        return out[:n]

    def rate(self, matched: int, source: str = "lookup") -> float:
        """Slot 1's acceptance."""
        return self.rates(matched, source, 1)[0]

    def record(self, matched: int, n_verified: int, n_accepted: int, source: str = "lookup",
               beside: bool = False) -> None:
        """A verified copied draft of n_verified tokens kept n_accepted: slots to the first rejection were reached."""
        key = self.key(matched, source, beside)
        count_slots(self.reached.setdefault(key, []), self.accepted.setdefault(key, []), n_verified, n_accepted)
        self._rates.pop(key, None)


@dataclass
class SlotRates:
    """The network's measured acceptance per slot of its sampled drafts (T > 0): slot k's tokens accepted over those
    verified with every earlier slot accepted, Beta-smoothed. At T > 0 a draft's own confidence (its largest
    probability) does not estimate acceptance (sum_v min(p, q)), so the cut reads these instead."""

    prior_rate: float = DEFAULTS.sampled_prior
    prior_weight: float = DEFAULTS.prior_weight
    reached: list = field(default_factory=list)  # per slot: drafts verified with every earlier slot accepted
    accepted: list = field(default_factory=list)  # per slot: of those, how many kept it

    def rates(self, n: int) -> torch.Tensor:
        """Each of the first n slots' acceptance given the earlier ones accepted. -> (n,)"""
        pad = [0.0] * max(0, n - len(self.reached))
        reached, accepted = torch.tensor((self.reached + pad)[:n]), torch.tensor((self.accepted + pad)[:n])  # (n,) each
        return smoothed_rate(accepted, reached, self.prior_rate, self.prior_weight)

    def record(self, n_verified: int, n_accepted: int) -> None:
        """A verified draft of n_verified tokens kept n_accepted: slots up to the first rejection were reached."""
        count_slots(self.reached, self.accepted, n_verified, n_accepted)
