"""DraftPolicy: each round's draft by one rule, and what its outcome teaches the store (state.PolicyState). Each source
its verdict allows offers expected tokens for a cost in plain rounds (offers.Offer): the best copy its cut prefix at its
measured acceptance; the network, before its call, what a plain round's time bought through its rounds in this reply
(Verdict.ratio), at least a plain step's worth (so it is measured again); a plain step one token. The round takes the
most tokens per unit of cost (ties: copy, network, plain); a probe every plain_probe_every rounds. K = block length."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from core.drafting.base import COPIED, Draft, Drafter
from core.drafting.policy.config import PolicyConfig
from core.drafting.policy.offers import EMPTY, PLAIN, Offer, best_copy, best_cut, best_draft_length, clip_draft
from core.drafting.policy.state import PolicyState
from core.verification.sampling import SamplingConfig

# what a source came to, or why it was not asked (beside state.WAITING, state.MEASURING)
PROBE = "not asked: a plain step is due (plain probe)"
NO_FREE_SOURCES = "none: this drafter has no free sources"
NONE_FOUND = "none found"
NONE_PAYS = "none pays under the cut"
OUTBID = "not taken: the network's measured rounds are worth more"
COPY_TAKEN = "not asked: a copy is worth more"
NO_FEATURES = "waiting: its features are being captured"
CUT_EMPTY = "called: its draft was cut to nothing"
SAMPLED_EMPTY = "not called: its measured acceptance cuts any draft to nothing"


@dataclass(frozen=True)
class Decision:
    """Why a round verified what it did: its source (Draft.shown_source), what the copies and the network came to."""

    source: str
    copies: str
    network: str

    def why(self) -> str:
        return f"copies {self.copies}; network {self.network}"


@dataclass
class FeatureCapture:
    """Which forwards capture the network's features (each costs): the prompt's, then cfg.capture_armed after a round
    that wanted it, where it may be called while they are in its window; called once cfg.capture_ready in a row did."""

    window: int  # Drafter.context_window
    cfg: PolicyConfig
    since_wanted: int = 1 << 30  # forwards since a round wanted the network
    run: int = 0  # forwards in a row that captured (the prompt's prefill counts as capture_ready)

    def captures(self, may_call: bool, prefill: bool = False) -> bool:
        capture = may_call and (prefill or self.since_wanted < self.cfg.capture_armed)
        self.since_wanted += not prefill
        self.run = (self.cfg.capture_ready if prefill else self.run + 1) if capture else 0
        return capture


@dataclass
class DraftPolicy:
    cfg: PolicyConfig
    state: PolicyState
    verify_cost: tuple[float, ...]  # the cost of 1, 2, ... positions: the start-up curve as the store measured it
    start_cost: tuple[float, ...]  # the start-up curve
    charged_cost: float  # a call's cost until measured (0: not charged: T > 0, or no curve)
    capture: FeatureCapture | None = None  # for a network with a context window; None: every forward captures
    since_plain: int = 0  # drafting rounds in a row
    called: bool = False  # whether this round called the network
    paid: bool = True  # whether its draft's cut paid for the call
    decision: Decision | None = None  # the last round's

    @classmethod
    def for_run(cls, gen, state: PolicyState | None = None, window: int | None = None) -> "DraftPolicy":
        """One generation's policy (gen: core.decoding.engine.GenerationConfig) on what `state` measured before."""
        cfg = gen.policy
        state = state or PolicyState.of(cfg)
        for verdict, patience in ((state.network, 0), (state.copies, cfg.copied_patience * gen.sampling.greedy)):
            verdict.max_wait, verdict.patience = cfg.max_skip, patience
            verdict.measures = cfg.plain_probe_every > 0 and cfg.max_skip > 0  # where plain rounds are and it may act
        capture = None if window is None else FeatureCapture(window, cfg)
        return cls(cfg, state, state.costs.curve(gen.verify_cost), gen.verify_cost,
                   gen.draft_cost if gen.charges_draft_cost() else 0.0, capture)

    def draft(self, drafter: Drafter, anchor: int, k: int, sampling: SamplingConfig,
              generator: torch.Generator) -> Draft:
        self.called, self.paid, network = False, True, self.state.network
        network_why, copies_held = network.hold(), self.state.copies.hold()  # asked every round: the waits run down
        if self.cfg.plain_probe_every and self.since_plain >= self.cfg.plain_probe_every:
            return self._decided(EMPTY, PROBE, PROBE)
        copy, copies_why = None, NO_FREE_SOURCES
        if hasattr(drafter, "propose_lookups"):  # drafters with free sources: LookupHybrid
            found = () if copies_held else drafter.propose_lookups(anchor, k)
            copy = best_copy(found, k, self.state.acceptance, self.verify_cost)
            copies_why = copies_held or (NONE_PAYS if found else NONE_FOUND)
        bid = Offer(max(network.ratio() or 1.0, 1.0), 1.0)
        if self.capture is not None and (copy is None or copy.value <= bid.value):
            self.capture.since_wanted = 0  # a round that wants the network
        if not network_why and self.capture is not None and self.capture.run < self.cfg.capture_ready:
            network_why = NO_FEATURES
        elif not network_why and not sampling.greedy and self.sampled_cut_is_empty(k):
            network_why = SAMPLED_EMPTY
            network.settle(paid=False)  # as after a draft that did not pay
        best = max((offer for offer in (copy, None if network_why else bid, PLAIN) if offer), key=lambda o: o.value)
        if best is not bid:
            verified = f"{len(best.draft.tokens)} tokens verified" if best is copy else copies_why
            return self._decided(best.draft, verified, network_why or COPY_TAKEN)
        self.called, proposal = True, drafter.propose(anchor, k, sampling, generator) or EMPTY
        confidence = proposal.confidence
        if confidence is not None and not sampling.greedy:  # cut on the slots' measured acceptance
            confidence = torch.tensor(self.state.acceptance.rates("drafter", 0, len(proposal.tokens)))  # (K,)
            proposal = replace(proposal, confidence=confidence)
        if confidence is not None and self.verify_cost:
            self.paid = best_cut(confidence[:k], self.verify_cost, self.call_cost())[0] > 0
        draft = clip_draft(proposal, k, self.verify_cost, self.cfg.max_lost)
        called = f"called: {len(proposal.tokens)} drafted, {len(draft.tokens)} verified" if draft.ids else CUT_EMPTY
        return self._decided(draft, OUTBID if copy else copies_why, called)

    def _decided(self, draft: Draft, copies: str, network: str) -> Draft:
        self.since_plain = 0 if len(draft.tokens) == 0 else self.since_plain + 1
        self.decision = Decision(draft.shown_source, copies, network)
        return draft

    def sampled_cut_is_empty(self, k: int) -> bool:  # measured sampled drafts: their acceptance cuts all to nothing
        acceptance, cost = self.state.acceptance, self.verify_cost
        return bool(cost) and ("drafter", 0) in acceptance.counts and \
            best_draft_length(acceptance.rates("drafter", 0, k), cost, self.cfg.max_lost) == 0

    def call_cost(self) -> float:  # a network call's cost where charged: as measured (Costs, n = 0), else the estimate
        return self.state.costs.medians.get(0, self.charged_cost) if self.charged_cost else 0.0

    def captures(self, prefill: bool = False) -> bool:
        """Whether this forward captures: every one without a FeatureCapture; with one, where the network may be called
        while these positions are in its window (its wait ends sooner, or this round's call may end it)."""
        capture = self.capture
        return capture is None or capture.captures(self.called or self.state.network.wait < capture.window, prefill)

    def observe(self, draft: Draft, n_accepted: int, n_committed: int, seconds: float,
                draft_seconds: float = 0.0) -> None:
        """A round's outcome into the store (seconds: drafting and verifying, draft_seconds of them drafting). A round
        that called the network is its round even if cut to nothing; copied rounds are set against all others."""
        source, state = draft.source, self.state
        if source not in COPIED:
            state.network.observe(self.called, n_committed, seconds, self.paid)
        if source != "drafter":
            state.copies.observe(source in COPIED, n_committed, seconds)
        if source in COPIED or (source == "drafter" and draft.q_draft is not None):  # a copy, or a sampled draft
            state.acceptance.record(source, draft.lookup_match, len(draft.tokens), n_accepted)
        if self.called:
            state.costs.record(0, draft_seconds)
        fed = 1 + len(draft.tokens)  # a tree is not a chain of its length: not recorded
        if not draft.alternatives and state.costs.record(fed, seconds - self.called * draft_seconds) \
                and fed <= len(self.start_cost):  # only that length's cost moved
            weighed = state.costs.weighed(fed, self.start_cost[fed - 1])
            self.verify_cost = (*self.verify_cost[: fed - 1], weighed, *self.verify_cost[fed:])
