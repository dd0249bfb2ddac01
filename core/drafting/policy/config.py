"""Every constant of the drafting policy, each with the reason for its value. The measurements behind them are in
docs/journal/engine.md ("The drafting policy"); the lab's comparisons (lab/) rerun them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyConfig:
    # -- set per reply from the drafter choice (app.service.engine_settings) ------------------------------------------
    # the longest back-off after a source's round lost (state.Verdict; 0: never): longer loses rounds where it pays
    max_skip: int = 8
    # expected tokens a round's cut may give up against the whole draft (RunSpec.max_lost, offers.best_draft_length)
    max_lost: float = 0.0
    # a plain step after this many drafting rounds in a row (0: never): the plain timings under a reply's own load that
    # the verdicts (none without them) and the app's speed ratio read; the app's drafting replies probe every 16
    plain_probe_every: int = 0
    app_probe_every: int = 16

    # -- verdicts against plain steps (state.Verdict) ----------------------------------------------------------------
    # the network's rounds are dear and rare: its verdict reads its last 16 rounds of each kind; a copied round's
    # margin over a plain round is thin, which 16 rounds on a busy machine reversed: the copies' read 64
    # (lab.copies_window_ab)
    network_window: int = 16
    copied_window: int = 64
    # rounds of each kind measured before the first verdict: fewer is noise, more delays a verdict a reply needs
    min_rounds: int = 3
    # at T = 0, copied rounds measured losing before their verdict sets its long wait: three cold first rounds had
    # switched copies off for replies where they paid (lab.verdict_ab); at T > 0 the first verdict's wait stays
    copied_patience: int = 16
    # a source measured slower than plain steps is retried rarely enough that its tries cost at most this share of a
    # reply's time, waiting at most longest_wait rounds (a reply of 1,024 tokens still retries once)
    try_budget: float = 0.005
    longest_wait: int = 1024
    # a round counts as at most this many mean plain rounds: a stall (another process, a page fault) is not what a
    # source costs, and the dearest real round (a call and a 17-position verify) costs less
    stall: float = 8.0

    # -- acceptance priors, each counting as prior_weight rounds so a few measured ones take over (state.Acceptance) --
    copy_prior: float = 0.7  # a copied token's, before the conversation measured its source and key
    # the network's sampled drafts' (T > 0) per slot: their confidence does not estimate sum min(p, q)
    sampled_prior: float = 0.5
    prior_weight: float = 2.0

    # -- costs measured in the reply (state.Costs) -------------------------------------------------------------------
    # recent rounds per fed length (and network calls) whose median is their cost, and how many before it counts; the
    # start-up curve counts as curve_weight rounds: measured medians are noisy
    cost_window: int = 16
    cost_min_rounds: int = 4
    curve_weight: float = 16.0

    # -- which forwards capture the network's features (policy.FeatureCapture, lab.capture_ab) -----------------------
    capture_armed: int = 32  # forwards after a round that wanted the network which capture
    capture_ready: int = 8  # forwards in a row the network needs captured before it is called

    # -- copies without a cost curve (core.drafting.base.lookup_plan) -------------------------------------------------
    lookup_strong: int = 3  # a conversation match this long is copied alone, without calling the network
    lookup_branch: int = 4  # a copy beside the network's draft joins the trie as a branch of at most this many tokens

    def __post_init__(self):
        least = {"max_skip": 0, "plain_probe_every": 0, "max_lost": 0}  # the counts below: 1
        for name in (*least, "network_window", "copied_window", "min_rounds", "longest_wait", "cost_window",
                     "cost_min_rounds", "capture_ready", "lookup_strong", "lookup_branch"):
            if getattr(self, name) < least.get(name, 1):
                raise ValueError(f"{name} must be >= {least.get(name, 1)}, got {getattr(self, name)}")
        if not 0 < self.try_budget < 1 or self.stall < 1:
            raise ValueError("try_budget must be in (0, 1) and stall >= 1")


DEFAULTS = PolicyConfig()
