"""What drafting measured in a reply, carried to the conversation's next reply (the app keeps one per drafter)."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.drafting.policy.config import DEFAULTS, PolicyConfig
from core.drafting.policy.costs import CallCost, RoundCosts
from core.drafting.policy.rates import LookupRates, SlotRates
from core.drafting.policy.waits import MeasuredPays


@dataclass
class PolicyState:
    """The network's rounds and the copied rounds (prompt lookup, phrasebook, block tail) each against plain steps
    (MeasuredPays: the network's verdict reads its last network_window rounds of each kind, the copies' their last
    copied_window), the copied drafts' acceptance, at T > 0 the network's acceptance per slot, what its calls and each
    length of round cost, and apart from chains what a copy try costs (its trie's mask and walk make it dearer than
    a chain of its length, so the start-up curve weighs less there). At T = 0 a losing verdict on copied rounds only
    backs off until copied_patience of them were measured. Built from a PolicyConfig (PolicyState.of); PolicyState()
    is the defaults'."""

    drafter: MeasuredPays = field(default_factory=MeasuredPays)
    lookup: MeasuredPays = field(default_factory=lambda: MeasuredPays(window=DEFAULTS.copied_window))
    copied_patience: int = DEFAULTS.copied_patience
    rates: LookupRates = field(default_factory=LookupRates)
    sampled: SlotRates = field(default_factory=SlotRates)
    call_cost: CallCost = field(default_factory=CallCost)
    costs: RoundCosts = field(default_factory=RoundCosts)
    tries: RoundCosts = field(default_factory=lambda: RoundCosts(prior_weight=DEFAULTS.try_curve_weight))

    @classmethod
    def of(cls, cfg: PolicyConfig) -> "PolicyState":
        """A state that has measured nothing yet, with cfg's windows, priors and weights."""
        def verdict(window: int) -> MeasuredPays:
            return MeasuredPays(window=window, min_rounds=cfg.min_rounds, budget=cfg.try_budget,
                                longest_wait=cfg.longest_wait, stall=cfg.stall)

        def costs(weight: float) -> RoundCosts:
            return RoundCosts(window=cfg.cost_window, min_rounds=cfg.cost_min_rounds, prior_weight=weight)

        return cls(drafter=verdict(cfg.network_window), lookup=verdict(cfg.copied_window),
                   copied_patience=cfg.copied_patience,
                   rates=LookupRates(cfg.copy_prior, cfg.prior_weight, cfg.beside_prior, cfg.lookup_strong),
                   sampled=SlotRates(cfg.sampled_prior, cfg.prior_weight),
                   call_cost=CallCost(cfg.call_window, cfg.call_min), costs=costs(cfg.curve_weight),
                   tries=costs(cfg.try_curve_weight))
