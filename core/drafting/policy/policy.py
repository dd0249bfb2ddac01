"""DraftPolicy: each round's draft, and what the round's outcome teaches the policy.

Shape letters: K = drafted block length."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from core.drafting.base import Copy, Draft, Drafter
from core.drafting.policy import sources
from core.drafting.policy.copy_choice import best_copy, best_try, cut_copy
from core.drafting.policy.cut import EMPTY, best_draft_length, clip_draft, draft_pays
from core.drafting.policy.sources import COPIED, Decision, round_source, shown_source
from core.drafting.policy.state import PolicyState
from core.drafting.policy.waits import HELD_MEASURING, HELD_WAIT, FeatureCapture, MeasuredPays, PlainProbe, SkipEmpty
from core.verification.sampling import SamplingConfig
from core.verification.tree import common_prefix


def held(measured: MeasuredPays) -> str:
    """Why a measured verdict held its source back this round ("" where it did not)."""
    return {HELD_WAIT: sources.SLOWER, HELD_MEASURING: sources.MEASURING}.get(measured.held, "")


@dataclass
class DraftPolicy:
    """When to call the drafter and how much of a draft to verify, one generation's: the adaptive cut under the verify
    cost (cut.clip_draft), the skips after drafts that did not pay for the drafter's call (waits.SkipEmpty,
    cut.draft_pays), the skips while a source measures slower than plain steps in this reply (waits.MeasuredPays, one
    per source), the copies' measured acceptance (rates.LookupRates) and the plain probes (waits.PlainProbe). Each
    round's `decision` says what it verified and why (sources.Decision). Whatever it decides, verification keeps the
    output exact."""

    # relative cost of 1, 2, ... positions the cut weighs: the start-up curve (core.runtime.verify_cost; () for no cut)
    # with the lengths this reply and conversation measured (costs.RoundCosts), renewed as rounds are measured
    verify_cost: tuple[float, ...]
    # what a network draft is charged for the drafter's call in the skips (cut.draft_pays) until this reply has
    # measured it (costs.CallCost); 0: nothing charged (T > 0, or no cost curve)
    charged_cost: float
    skip: SkipEmpty
    probe: PlainProbe
    state: PolicyState
    called: bool = False  # whether this round called the network (its draft may still have been cut to nothing)
    start_cost: tuple[float, ...] = ()  # the start-up curve the measured lengths replace (RoundCosts.curve)
    copy_tries: bool = False  # two copies that differ at their first token may be verified together (best_try)
    try_cost: tuple[float, ...] = ()  # what a copy try over 1, 2, ... positions costs (PolicyState.tries' curve)
    # for a drafter with a context window: which forwards capture its features, and whether its network has them;
    # None: every forward captures, and the network is called whenever the policy asks
    capture: FeatureCapture | None = None
    decision: Decision | None = None  # the last round's
    max_lost: float = 0.0  # expected tokens a round the cut may give up against the whole draft (0: no bound)

    @classmethod
    def for_run(cls, gen, state: PolicyState | None = None, window: int | None = None) -> "DraftPolicy":
        """The policy of one generation (gen: core.decoding.engine.GenerationConfig, its `policy` the constants),
        from what `state` measured before; window: the drafter's context window (Drafter.context_window)."""
        cfg = gen.policy
        state = state or PolicyState.of(cfg)
        for measured in (state.drafter, state.lookup):
            measured.max_skip = cfg.max_measured_wait if cfg.plain_probe_every else 0
        state.lookup.confident_rounds = state.copied_patience if gen.sampling.greedy else 0
        charged = gen.draft_cost if gen.charges_draft_cost() else 0.0
        capture = None if window is None else FeatureCapture(window, cfg.capture_armed, cfg.capture_ready)
        return cls(state.costs.curve(gen.verify_cost), charged, SkipEmpty(cfg.max_skip if gen.verify_cost else 0),
                   PlainProbe(cfg.plain_probe_every), state, start_cost=gen.verify_cost, copy_tries=cfg.copy_tries,
                   try_cost=state.tries.curve(gen.verify_cost), capture=capture, max_lost=cfg.max_lost)

    def draft(self, drafter: Drafter, anchor: int, k: int, sampling: SamplingConfig,
              generator: torch.Generator) -> Draft:
        """This round's draft: a copied draft where one exists, pays under the cut and the measured rounds allow it
        (the one that pays most), else the network's where the policy calls it, else an empty one (a plain step).
        Sets `decision`."""
        draft, copies, network = self._choose(drafter, anchor, k, sampling, generator)
        self.decision = Decision(shown_source(draft), copies, network)
        return draft

    def _choose(self, drafter: Drafter, anchor: int, k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> tuple[Draft, str, str]:
        """(the round's draft, what the copies came to, what the network came to)."""
        # each wait runs down only while it is asked, so ask them every round, before the probe
        self.called = False
        lookup_now = self.state.lookup.draft_now()
        measured_now = self.state.drafter.draft_now()
        network_now = measured_now and self.skip.draft_now()
        network = "" if network_now else held(self.state.drafter) if not measured_now else sources.DID_NOT_PAY
        if self.probe.due():
            return self.cut(None, k), sources.PROBE, sources.PROBE
        propose_lookups = getattr(drafter, "propose_lookups", None)  # drafters with free sources (LookupHybrid)
        copies = sources.NO_FREE_SOURCES if propose_lookups is None else held(self.state.lookup)
        if lookup_now and propose_lookups is not None:
            offered = propose_lookups(anchor, k)
            lookup = self.best_lookup(offered, k)
            if len(lookup.tokens):
                self.probe.record(plain=False)
                return lookup, f"{len(lookup.tokens)} tokens verified", sources.COPY_TAKEN
            copies = sources.NONE_PAYS if offered else sources.NONE_FOUND
        if self.capture is not None:  # a network that reads a window of features: called once it has them
            self.capture.wanted()
            if network_now and not self.capture.is_ready():
                network_now, network = False, sources.NO_FEATURES
        if network_now and not sampling.greedy and self.sampled_cut_is_empty(k):
            network_now, network = False, sources.SAMPLED_EMPTY  # the call is not made; the skips back off as then
            self.skip.drafted(paid=False)
        self.called = network_now
        proposal = drafter.propose(anchor, k, sampling, generator) if network_now else None
        if proposal is not None and not sampling.greedy and proposal.confidence is not None:
            proposal = replace(proposal, confidence=self.state.sampled.rates(len(proposal.tokens)))  # (K,) measured
        draft = self.cut(proposal, k)
        if proposal is not None:
            network = (f"called: {len(proposal.tokens)} drafted, {len(draft.tokens)} verified" if len(draft.tokens)
                       else sources.CUT_EMPTY)
        return draft, copies, network

    def may_call_within(self, rounds: int) -> bool:
        """Whether the network may be called in one of the next `rounds` rounds: its measured verdict's wait and the
        skips' run down one after the other (draft asks the second only once the first is over), so the earliest
        call is their sum of rounds away; a round that called it counts too (its verdict may reset the waits)."""
        return self.called or self.state.drafter.wait + self.skip.wait < rounds

    def captures(self, prefill: bool = False) -> bool:
        """Whether this forward (the prompt's prefill, or a round's) captures the drafter's features (FeatureCapture;
        every forward without one). A feature captured earlier than the network's next call minus its window is
        never read."""
        capture = self.capture
        return capture is None or capture.captures(self.may_call_within(capture.window), prefill)

    def sampled_cut_is_empty(self, k: int) -> bool:
        """At T > 0 the network's draft is cut on its slots' measured acceptance (SlotRates), which is known before the
        call: whether that cuts any draft of up to k slots to nothing (such calls cost a call and verify nothing).
        Only once sampled drafts were measured, so a drafter without them is called as before."""
        rates = self.state.sampled
        if not self.verify_cost or not rates.reached:
            return False
        return best_draft_length(rates.rates(k).tolist(), self.verify_cost, self.max_lost) == 0

    def best_lookup(self, copies: tuple[Copy, ...], k: int) -> Draft:
        """The round's copied draft (copy_choice.best_copy), copy tries where they are on."""
        return best_copy(copies, k, self.state.rates, self.verify_cost, self.try_cost if self.copy_tries else ())

    def best_try(self, copies: tuple[Copy, ...], cuts: list[int], k: int) -> tuple[Draft | None, float]:
        return best_try(copies, cuts, k, self.state.rates, self.try_cost)

    def cut_copy(self, copy: Copy, k: int) -> tuple[int, float]:
        return cut_copy(copy, k, self.state.rates, self.verify_cost)

    def cut_lookup(self, copy: Copy | None, k: int) -> Draft:
        """The part of a copy worth verifying, as a draft (cut_copy); an empty draft for none."""
        if copy is None:
            return EMPTY
        n, _ = self.cut_copy(copy, k)
        return copy.draft(n) if n else EMPTY

    def observe(self, draft: Draft, n_accepted: int, n_committed: int, seconds: float,
                draft_seconds: float = 0.0, accepted: list[int] | None = None) -> None:
        """A round's outcome: what it committed and what it cost (drafting and verifying; draft_seconds: drafting
        alone; accepted: the drafted tokens kept, which tell a copy try's branches apart), for the measured policies;
        what a copied draft kept, for its source's rates. For the network's verdict a round that called it counts as
        drafting even when its draft was cut to nothing: it paid for the call. The copied rounds' verdict compares
        them with every other round that verified nothing, as it would be without them."""
        source = round_source(draft)
        if source not in COPIED:
            self.state.drafter.observe(self.called, n_committed, seconds)
        if source != "drafter":
            self.state.lookup.observe(source in COPIED, n_committed, seconds)
        if self.called:
            self.state.call_cost.record(draft_seconds)
        if source in COPIED:
            self._observe_copy(draft, n_accepted, accepted or [])
        if source == "drafter" and draft.q_draft is not None:  # a sampled draft (T > 0): its acceptance per slot
            self.state.sampled.record(len(draft.tokens), n_accepted)
        self._observe_cost(draft, seconds, draft_seconds)

    def _observe_copy(self, draft: Draft, n_accepted: int, accepted: list[int]) -> None:
        """What a copied draft kept, for its source's rates; a copy try's branches each kept what they share with the
        accepted tokens."""
        rates = self.state.rates
        if draft.beside is None:
            rates.record(draft.lookup_match, len(draft.tokens), n_accepted, draft.lookup_source)
            return
        other = draft.alternatives[0]
        rates.record(draft.lookup_match, len(draft.tokens), common_prefix(draft.ids, accepted), draft.lookup_source)
        rates.record(draft.beside[1], len(other), common_prefix(other, accepted), draft.beside[0], beside=True)

    def _observe_cost(self, draft: Draft, seconds: float, draft_seconds: float) -> None:
        """What the round's length cost: a chain (or nothing) fed 1 + its tokens, a copy try the anchor and both
        branches; a tree of network drafts is neither."""
        if not draft.alternatives:
            verified, fed = seconds - (draft_seconds if self.called else 0.0), 1 + len(draft.tokens)
            if self.state.costs.record(fed, verified):
                self.verify_cost = self.state.costs.renewed(self.verify_cost, self.start_cost, fed)
            if fed == 1 and self.copy_tries:  # the plain rounds the copy tries' costs are set against
                self.state.tries.record(1, verified)
        elif draft.beside is not None:
            fed = 1 + len(draft.tokens) + len(draft.alternatives[0])
            if self.state.tries.record(fed, seconds):
                self.try_cost = self.state.tries.renewed(self.try_cost, self.start_cost, fed)

    def call_cost(self) -> float:
        """What the skips charge a network draft for its call: measured in this reply (CallCost) where it is charged."""
        if not self.charged_cost:
            return 0.0
        return self.state.call_cost.in_steps(self.state.drafter.plain_rounds, self.charged_cost)

    def cut(self, proposal: Draft | None, k: int) -> Draft:
        """The part of the network's proposal to verify (an empty draft for none)."""
        draft = clip_draft(proposal, k, self.verify_cost, self.max_lost)
        if proposal is not None and proposal.confidence is not None and self.verify_cost:  # a draft it can cut
            self.skip.drafted(draft_pays(proposal.confidence[:k], self.verify_cost, self.call_cost()))
        self.probe.record(plain=len(draft.tokens) == 0)
        return draft
