"""Every constant of the drafting policy, each with the reason for its value. The measurements behind them are in
docs/journal/engine.md ("The drafting policy"); the lab's comparisons (lab/) rerun them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyConfig:
    # -- what a drafter choice turns on (app.service.engine_settings sets these per reply) ---------------------------
    # skip the network's call for 1, 2, 4 ... rounds after drafts that did not pay for it, at most this many: a call
    # costs a fraction of a target step, so a longer skip loses the rounds where it pays again
    max_skip: int = 8
    # expected tokens a round the cut may give up against verifying the whole draft (cut.within_loss): 0, no bound,
    # the cut weighs verify cost alone; RunSpec.max_lost sets it
    max_lost: float = 0.0
    # a plain step after this many drafting rounds in a row (0: never), so a reply carries plain-step timings measured
    # under its own load, which the measured verdicts and the app's speed ratio read
    plain_probe_every: int = 0
    # what the app's drafting replies set plain_probe_every to: a probe every 16 rounds costs < 3% of their speed
    app_probe_every: int = 16
    # longest back-off while a source's rounds measure fewer tokens a second than plain steps (0: never skip)
    max_measured_wait: int = 32
    # two copies that differ at their first token verified together as a trie where the pair pays; off by default:
    # on the CPUs measured the pairs did not pay (docs/journal/engine.md)
    copy_tries: bool = False

    # -- measured verdicts against plain steps (waits.MeasuredPays) --------------------------------------------------
    # the network's rounds cost 2-3 plain rounds and are rare: its verdict reads its last 16 rounds of each kind
    network_window: int = 16
    # a copied round commits ~1.3-2 tokens for 1.1-1.4 plain rounds, a margin 16 rounds on a busy machine reversed:
    # the copies' verdict reads 64 (lab.copies_window_ab)
    copied_window: int = 64
    # rounds of each kind measured before the first verdict: fewer is noise, more delays a verdict a reply needs
    min_rounds: int = 3
    # at T = 0, copied rounds measured before a losing verdict sets its long wait: three cold first rounds had
    # switched copies off for replies where they paid (lab.verdict_ab); at T > 0 the first verdict's wait stays
    copied_patience: int = 16
    # a source measured slower than plain steps is retried rarely enough that its tries cost at most this share of a
    # reply's time: 1% let the network's tries cost 0.9-1.4% of rounds where it never paid
    try_budget: float = 0.005
    # the longest such wait, in rounds: a reply of 1,024 tokens still retries once
    longest_wait: int = 1024
    # a round counts as at most this many mean plain rounds: a stall (another process, a page fault) is not what a
    # source costs; the dearest real round (a network call and a 17-position verify at T > 0) costs ~6.5
    stall: float = 8.0

    # -- acceptance priors (rates.LookupRates, rates.SlotRates) -----------------------------------------------------
    # a copied token's acceptance before this conversation measured its source and match length
    copy_prior: float = 0.7
    # a copy verified beside another with a different first token: the less likely of the two was the target's
    # token in 0.04-0.28 of held-out positions (drafter.evaluation.phrasebook_check --tries)
    beside_prior: float = 0.15
    # the network's sampled drafts (T > 0) per slot, before measured: its own confidence does not estimate sum min(p, q)
    sampled_prior: float = 0.5
    # how many rounds a prior counts as: two, so a few rounds' measurements take over
    prior_weight: float = 2.0

    # -- costs measured in the reply (costs.CallCost, costs.RoundCosts) ---------------------------------------------
    # recent network calls whose median is its cost in plain steps, and how many before it replaces the estimate
    call_window: int = 16
    call_min: int = 3
    # recent rounds per fed length whose median over the plain round's is that length's cost, and how many first
    cost_window: int = 16
    cost_min_rounds: int = 4
    # the start-up cost curve counts as this many rounds: measured medians are noisy (1.01-1.22 for two positions)
    curve_weight: float = 16.0
    # a copy try's curve counts as 4: its trie's mask and walk make it dearer than the chain curve says
    try_curve_weight: float = 4.0

    # -- when the engine captures the network's features (waits.FeatureCapture) -------------------------------------
    # forwards after a round that wanted the network which capture, and how many in a row before it is called:
    # capturing only there made the default 1.7% +- 0.6% faster (lab.capture_ab)
    capture_armed: int = 32
    capture_ready: int = 8

    # -- copies without a cost curve (core.drafting.base.lookup_plan) and beside the network's draft ---------------
    # a conversation match of this many tokens is copied alone, without calling the network
    lookup_strong: int = 3
    # a copy beside the network's draft joins the trie as a branch of at most this many tokens
    lookup_branch: int = 4

    def __post_init__(self):
        for name in ("max_skip", "plain_probe_every", "max_measured_wait"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        counts = ("network_window", "copied_window", "min_rounds", "longest_wait", "call_window", "call_min",
                  "cost_window", "cost_min_rounds", "capture_ready", "lookup_strong", "lookup_branch")
        for name in counts:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_lost < 0:
            raise ValueError(f"max_lost must be >= 0, got {self.max_lost}")
        if not 0 < self.try_budget < 1 or self.stall < 1:
            raise ValueError("try_budget must be in (0, 1) and stall >= 1")


DEFAULTS = PolicyConfig()
