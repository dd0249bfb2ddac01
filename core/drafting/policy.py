"""When to draft and how much of a draft to verify: a policy only. Whatever it decides, verification keeps the output
exact, because every choice reads past rounds (their committed tokens and timings) and never the token being verified.

Shape letters: K = drafted block length.

Three kinds of source per round, in this order: a copied draft (free: no network call, `LookupHybrid.propose_lookups`:
prompt lookup in the conversation, or the target's phrasebook), the drafter's network, or none (a plain step). Their
parts:
- the adaptive cut (clip_draft, best_draft_length): the prefix with the most expected committed tokens per unit of
  this machine's verify cost (core.runtime.verify_cost), from per-slot confidence;
- copy tries (DraftPolicy.best_try): two copies that differ at their first token verified together as a trie, where
  the pair's expected tokens per unit of verify cost beat either alone;
- SkipEmpty: after drafts whose expected tokens do not pay for the drafter's own call, skip it for 1, 2, 4 ... rounds;
- MeasuredPays: while a source's rounds commit fewer tokens a second than plain steps in this reply, skip it;
- LookupRates: how often a copied token was accepted, per source and length of the matched suffix, as its confidence;
- PlainProbe: a plain step at least every N rounds, so there always are plain timings to compare with;
- CallCost: what a call of the network costs in this reply, measured against plain steps, which the skips charge;
- RoundCosts: what a round over n positions costs in this reply against plain rounds, which the cut weighs beside the
  start-up curve.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from core.decoding.prefix import common_prefix
from core.decoding.sampling import SamplingConfig
from core.drafting.base import LOOKUP_STRONG, Copy, Draft, Drafter, lookup_plan

EMPTY = Draft(torch.empty(0, dtype=torch.long), None)
COPIED = ("lookup", "phrasebook", "tail")  # the free sources' round names (Draft.lookup_source)
COPIED_WINDOW = 64  # rounds of each kind the copied rounds' verdict reads (PolicyState)
COPIED_PATIENCE = 16  # copied rounds measured before its verdict may set the budget's long wait (PolicyState)


@dataclass
class SkipEmpty:
    """When to call the drafter: after `empty` drafts in a row that did not pay for themselves (draft_pays), skip
    the next min(2^(empty-1), max_skip) rounds, which are then plain steps; a draft that paid resets it.
    A policy only: a skipped round verifies an empty draft, so the output stays exact."""

    max_skip: int
    empty: int = 0
    wait: int = 0

    def draft_now(self) -> bool:
        if self.wait > 0:
            self.wait -= 1
            return False
        return True

    def drafted(self, paid: bool) -> None:
        self.empty = 0 if paid else self.empty + 1
        self.wait = min(2 ** (self.empty - 1), self.max_skip) if self.empty else 0


@dataclass
class FeatureCapture:
    """When the engine captures the drafter's features (core.decoding.engine.captures) and when its network has enough
    of them
    to be called. The network is asked only in rounds where no copy pays, ~1 in 10-20 on math and code, yet its
    features were captured, kept and handed to it in every forward: capturing only as below made the app's default
    1.7% +- 0.6% faster, pooled over ten paired sets (`python -m lab.capture_ab`, docs/engine.md). The prompt's
    prefill captures (the network starts with its context), then only the `armed` forwards after a round that wanted
    the network do, and after a gap the network is called only once `ready` forwards in a row captured its context
    again. A drafter that is all network wants it every round and so captures every forward, as before. A policy
    only: the logits are the same either way."""

    window: int  # the positions before the anchor whose features the network reads (Drafter.context_window)
    armed: int = 32
    ready: int = 8
    since_wanted: int = 1 << 30  # forwards since a round wanted the network (none yet)
    run: int = 0  # forwards in a row that captured (the prompt's prefill counts as `ready` of them)

    def wanted(self) -> None:
        """This round found no copy that pays: the network is what could draft here."""
        self.since_wanted = 0

    def captures(self, may_call: bool, prefill: bool = False) -> bool:
        """Whether this forward captures (asked once a forward, before it): the prompt's prefill, and a round within
        `armed` forwards of one that wanted the network; each only where the network's waits let it be called while
        these positions are in its window."""
        capture = may_call and (prefill or self.since_wanted < self.armed)
        if not prefill:
            self.since_wanted += 1
        self.run = (self.ready if prefill else self.run + 1) if capture else 0
        return capture

    def is_ready(self) -> bool:
        return self.run >= self.ready


@dataclass
class PlainProbe:
    """When to make a round a plain step without calling the drafter: after `every` rounds in a row that all
    drafted something (0: never). A policy only: a plain round verifies an empty draft, so the output stays exact;
    it costs at most one round's drafting in `every`."""

    every: int
    since_plain: int = 0

    def due(self) -> bool:
        return self.every > 0 and self.since_plain >= self.every

    def record(self, plain: bool) -> None:
        self.since_plain = 0 if plain else self.since_plain + 1


@dataclass
class MeasuredPays(SkipEmpty):
    """Whether drafting pays in wall time, as measured in this reply: tokens committed per second by the rounds that
    drafted against the rounds that did not (plain steps, which the plain probes guarantee), over the last `window`
    rounds of each kind. While drafting rounds commit fewer tokens a second than plain steps, skip the drafter for
    1, 2, 4, ... up to `max_skip` rounds (SkipEmpty's back-off, with a measured verdict instead of the drafter's
    confidence), then draft once more to measure again; a drafting round that pays resets the wait. It sees
    everything a draft costs (the drafter's call, the longer verify, the cut). A policy only: it decides from past
    rounds' timings and committed tokens, never from the round being verified, so the output stays exact at every
    temperature. 0 max_skip: never skips."""

    max_skip: int = 32
    window: int = 16
    min_rounds: int = 3  # rounds of each kind measured before the first verdict
    # a drafter measured far slower than plain steps is re-measured rarely enough that its tries cost at most this
    # share of the time (budget_wait), up to `longest_wait` rounds, beyond the back-off's own limit: a try of the
    # FlashMap network at T > 0 costs ~5 plain steps here (its call ~2, a long verify ~4.5, for ~1.3 tokens), and a
    # cap of 256 rounds had let such tries cost 2-5% of a reply. Half a percent: on the AVX2 EPYC the network's rounds
    # never paid in any domain or temperature (1.9-2.8 plain rounds for 1.2-1.7 tokens), and a 1% budget let its tries
    # cost 0.9-1.4% of the rounds (0.35.0's bench, docs/engine.md); where it pays, no wait is set at all
    budget: float = 0.005
    longest_wait: int = 1024
    # a round counts as at most this many mean plain rounds: a stall (another process, a page fault) is not what a
    # source costs, and a round of half a second (~100 plain rounds) among a verdict's first few sets the longest wait
    # (copies off for 1,024 rounds; counted as 8, 294: tests/test_policy.py); the dearest round a source makes costs
    # ~6.5 (the network's call and a 17-position verify at T > 0)
    stall: float = 8.0
    # drafting rounds measured before a losing verdict sets the budget's wait: until then it backs off 1, 2, 4 ...
    # rounds only, so a reply's first few rounds (cold caches, the first forward of each length, a busy moment) cannot
    # switch a source off for a hundred rounds (0: from the first verdict)
    confident_rounds: int = 0
    drafted_rounds: list = field(default_factory=list)  # (tokens committed, seconds) of recent drafting rounds
    plain_rounds: list = field(default_factory=list)  # (tokens committed, seconds) of recent plain rounds
    # per kind: the kept rounds' (tokens, seconds) summed, kept as rounds come and go (not summed anew, 64 rounds
    # twice, each round)
    _sums: dict = field(default_factory=lambda: {True: [0, 0.0], False: [0, 0.0]}, repr=False, compare=False)

    @property
    def losses(self) -> int:
        """Drafting rounds in a row measured slower than plain steps."""
        return self.empty

    def draft_now(self) -> bool:
        if not super().draft_now():
            return False
        # the first rounds alternate until both kinds are measured, so a verdict comes within a few rounds
        plain, drafted = len(self.plain_rounds), len(self.drafted_rounds)
        return not (self.max_skip and plain < self.min_rounds and drafted > plain)

    def observe(self, drafted: bool, committed: int, seconds: float) -> None:
        if len(self.plain_rounds) >= self.min_rounds:  # a stall counts as `stall` mean plain rounds
            seconds = min(seconds, self.stall * self._sums[False][1] / len(self.plain_rounds))
        rounds, sums = (self.drafted_rounds if drafted else self.plain_rounds), self._sums[drafted]
        rounds.append((committed, seconds))
        sums[0], sums[1] = sums[0] + committed, sums[1] + seconds
        while len(rounds) > self.window:
            gone, gone_seconds = rounds.pop(0)
            sums[0], sums[1] = sums[0] - gone, sums[1] - gone_seconds
        if drafted and self.max_skip and self._measured():
            ratio = self.summed_rate(True) / self.summed_rate(False)
            self.drafted(paid=ratio >= 1)
            if ratio < 1 and len(self.drafted_rounds) >= self.confident_rounds:
                tokens = sum(c for c, _ in self.drafted_rounds) / len(self.drafted_rounds)
                self.wait = max(self.wait, min(self.budget_wait(ratio, tokens), self.longest_wait))

    def budget_wait(self, ratio: float, tokens: float = 1.0) -> int:
        """Plain rounds to wait after drafting rounds measured at `ratio` of plain steps' tokens a second, `tokens`
        committed a round: such a round takes tokens * (1 / ratio - 1) plain rounds longer than plain steps would
        for its tokens, which must stay within `budget` of the rounds."""
        return math.ceil(tokens * (1 / max(ratio, 1e-3) - 1) / self.budget)

    def summed_rate(self, drafted: bool) -> float:
        """Tokens committed a second by the drafting (or plain) rounds kept, from their running sums; inf for none."""
        tokens, seconds = self._sums[drafted]
        return tokens / seconds if seconds > 0 else float("inf")

    def _measured(self) -> bool:
        return len(self.drafted_rounds) >= self.min_rounds and len(self.plain_rounds) >= self.min_rounds


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
    """How often a copied token was accepted once verified, per source, key (prompt lookup's matched suffix of 1..3
    tokens, longer matches copying more reliably; the phrasebook's grade, its match length and agreement class; the
    block tail's confidence) and depth in the copy: slot k's tokens accepted over those verified with every earlier slot
    accepted, Beta-smoothed towards slot k - 1's rate (slot 1's towards prior_rate), so a depth not measured yet reads
    as the one before it, or towards the copy's own prior where its source knows one (the phrasebook's calibration).
    These serve as the slots' confidence for the adaptive cut. Deeper copied tokens are kept more often than the
    first: once a copy is on its track it tends to stay there (the phrasebook's 4-token matches on held-out replies
    kept 0.58 of first tokens, 0.78 of fourth and 0.89 of eighth, given the earlier ones: `python -m
    drafter.phrasebook_check`), which one rate for all slots missed. Measured on this conversation's own rounds, so
    it is a policy input like the timings: exact at every temperature (at T > 0 it measures the acceptance p(token)
    of the copied tokens)."""

    prior_rate: float = 0.7
    prior_weight: float = 2.0
    # a copy verified beside another whose first token differs (a copy try, DraftPolicy.best_try) is measured apart
    # and starts from a prior of its own: where the conversation's copy and the phrasebook's differed at their first
    # token (0.41-0.44 of the positions of held-out replies), the less likely of the two was the target's token in
    # 0.04-0.28 of them by the lookup's match length, the likelier in 0.34-0.82 (`python -m drafter.phrasebook_check
    # --tries`, docs/results/phrasebook-check-shipped-2026-12-04.json)
    beside_prior: float = 0.15
    reached: dict[tuple, list] = field(default_factory=dict)  # per key: per slot, copies verified that far
    accepted: dict[tuple, list] = field(default_factory=dict)  # per key: per slot, of those, how many kept it
    # per key: the slots' rates as last computed, until that key records again (most rounds offer copies under keys
    # that recorded nothing since: their rates were recomputed slot by slot every round)
    _rates: dict[tuple, list] = field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def key(matched: int, source: str = "lookup", beside: bool = False) -> tuple:
        key = (source, min(matched, LOOKUP_STRONG) if source == "lookup" else matched)
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
    probability) does not estimate acceptance (sum_v min(p, q)); cut on it, a try verified long drafts (17 positions
    cost ~5 steps here) for ~1.3 tokens. Measured on past rounds only, so exact like every policy input."""

    prior_rate: float = 0.5
    prior_weight: float = 2.0
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


@dataclass
class CallCost:
    """What a call of the drafter's network costs, in plain steps, as measured in this reply: the median of its recent
    calls' seconds over the median plain round's (the plain rounds MeasuredPays keeps). The bench's start-up estimate
    (core.runtime.verify_cost.draft_cost, a warm drafter called beside one-position forwards) read 0.55 of a step where
    calls
    in a reply took 0.73 (math, AVX2 EPYC, 2026-12-02): there each call first projects every position committed since
    the last one, and its weights come back from memory. Measured on past rounds only, so exact like every policy
    input."""

    window: int = 16
    min_calls: int = 3
    calls: list = field(default_factory=list)  # seconds of recent network calls

    def record(self, seconds: float) -> None:
        self.calls.append(seconds)
        del self.calls[: -self.window]

    def in_steps(self, plain_rounds: list, estimate: float) -> float:
        """The measured cost, or `estimate` until enough calls and plain rounds (MeasuredPays' (tokens, seconds))
        were measured."""
        if len(self.calls) < self.min_calls or len(plain_rounds) < self.min_calls:
            return estimate
        step = sorted(seconds for _, seconds in plain_rounds)[len(plain_rounds) // 2]
        return sorted(self.calls)[len(self.calls) // 2] / step if step > 0 else estimate


@dataclass
class RoundCosts:
    """What a round that fed n positions costs in this reply and conversation, relative to a plain round: the median
    over the recent rounds that fed n positions of their seconds (a network call's own aside: CallCost charges those)
    over the median plain round's at the time, once `min_rounds` of them were measured; the start-up curve
    (core.runtime.verify_cost, timed forwards at load) for the lengths not measured yet. Each round is set against the
    plain
    rounds of its own time because this shared machine's speed moves by half within minutes, and a rare length's
    rounds can be minutes old. Two things make the start-up curve a poor guide on its own: it times bare forwards,
    where a copied round also pays the Python around them, cold after each forward (a one-token copy cost 1.28-1.32
    plain rounds in 0.34.0's chat bench where start-up curves read 1.12-1.20; AVX2 EPYC, 2026-12-03), and it is
    measured once, in a few seconds (start-ups minutes apart read 1.53-1.82 for four positions). Against the start-up
    curve alone: chat 1.05x, code 1.01x, math 1.02x, and 1.03-1.05x on a curve half again as steep
    (lab.round_costs_ab, docs/engine.md). A length found dear is verified less and so measured less: its window
    keeps the last rounds that fed it. A policy input only (past rounds' timings): exact at every temperature."""

    window: int = 16
    min_rounds: int = 4
    prior_weight: float = 16.0  # the start-up curve counts as this many rounds (curve)
    plain: list = field(default_factory=list)  # seconds of recent plain rounds
    step: float = 0.0  # their median, once measured
    ratios: dict[int, list] = field(default_factory=dict)  # positions fed (> 1) -> recent rounds over the plain median
    medians: dict[int, float] = field(default_factory=dict)  # positions fed -> the median of those, once measured

    def record(self, fed: int, seconds: float) -> bool:
        """A round that fed `fed` positions took `seconds`; whether a measured cost changed (the curve to renew)."""
        if fed == 1:
            self.plain.append(seconds)
            del self.plain[: -self.window]
            if len(self.plain) >= self.min_rounds:
                self.step = sorted(self.plain)[len(self.plain) // 2]
            return False
        if self.step <= 0:
            return False
        ratios = self.ratios.setdefault(fed, [])
        ratios.append(seconds / self.step)
        del ratios[: -self.window]
        if len(ratios) < self.min_rounds:
            return False
        self.medians[fed] = sorted(ratios)[len(ratios) // 2]
        return True

    def curve(self, start: tuple[float, ...]) -> tuple[float, ...]:
        """The cost of 1, 2, ... positions relative to one: where a length was measured, its median within the
        physical bounds (at least a plain round, at most n of them) weighed against `start`'s by the rounds behind it,
        m / (m + prior_weight); `start`'s elsewhere; () for no cost curve (no cut). Not the median alone: it is noisy
        here, the cost of two positions ending four runs of 24 replies at 1.01-1.22 plain rounds."""
        if not start or not self.medians:
            return start
        return tuple(cost if n not in self.medians else self._weighed(n, cost) for n, cost in enumerate(start, start=1))

    def renewed(self, curve: tuple[float, ...], start: tuple[float, ...], fed: int) -> tuple[float, ...]:
        """`curve` (curve(start) before the last record) once a record of `fed` positions changed that median:
        only that length's cost moves."""
        if fed > len(start) or fed not in self.medians:
            return curve
        return (*curve[: fed - 1], self._weighed(fed, start[fed - 1]), *curve[fed:])

    def _weighed(self, n: int, start: float) -> float:
        measured, rounds = min(max(self.medians[n], 1.0), float(n)), len(self.ratios[n])
        return (rounds * measured + self.prior_weight * start) / (rounds + self.prior_weight)


@dataclass
class PolicyState:
    """What drafting measured in this reply, carried to the conversation's next reply (the app keeps one per drafter):
    the network's rounds and the copied rounds (prompt lookup, phrasebook, block tail) each against plain steps, the
    copied drafts' acceptance and, at T > 0, the network's acceptance per slot. The copied rounds' verdict reads the
    last 64 rounds of each kind: a copied round commits ~1.3-2 tokens for 1.1-1.4 plain rounds, a margin that 16
    rounds' timings on a busy machine often reversed, skipping copies that paid (lab.copies_window_ab, 24 prompts,
    AVX2 EPYC, 2026-12-03: 64 rounds against 16, chat +1.7% +- 1.6% and math +1.1% +- 1.9% at T = 0, and in earlier
    runs chat +3.3% / +1.7% at T = 0 / 1, math +3.5%; never skipping copies lost on math, -1.0% +- 2.1%). The
    network's rounds cost 2-3 plain rounds and are rare, so its verdict keeps 16. At T = 0, until 16 copied rounds
    were measured a losing verdict only backs off (MeasuredPays.confident_rounds): a first verdict on three cold rounds
    had set a wait of ~50 rounds, and each later try added one round to a window that still held them, so copies stayed
    off for replies where they paid; at T > 0, where copies pay by a few percent at most, the first verdict's wait
    stays (lab.verdict_ab, docs/engine.md)."""

    drafter: MeasuredPays = field(default_factory=MeasuredPays)
    lookup: MeasuredPays = field(default_factory=lambda: MeasuredPays(window=COPIED_WINDOW))
    # the copied rounds measured before their verdict may set its long wait at T = 0 (DraftPolicy.for_run sets it on
    # `lookup` for each reply; 0 at T > 0)
    copied_patience: int = COPIED_PATIENCE
    rates: LookupRates = field(default_factory=LookupRates)
    sampled: SlotRates = field(default_factory=SlotRates)
    call_cost: CallCost = field(default_factory=CallCost)
    costs: RoundCosts = field(default_factory=RoundCosts)
    # what a copy try over n positions costs, apart from chains: its trie's mask and walk make it dearer than a chain
    # of its length (1.5 plain rounds for three positions at T = 1 where the start-up curve read ~1.25; docs/engine.md),
    # so the start-up curve weighs as 4 of its rounds, not 16
    tries: RoundCosts = field(default_factory=lambda: RoundCosts(prior_weight=4.0))


def round_source(draft: Draft) -> str:
    """What a round verified: "plain" (nothing), "lookup", "phrasebook" or "tail" (a copied draft, no network call) or
    "drafter"."""
    if len(draft.tokens) == 0:
        return "plain"
    return draft.lookup_source if draft.lookup_match else "drafter"


def shown_source(draft: Draft) -> str:
    """What a round verified, as its event says it: round_source, but a copy joined beside an empty network draft
    (Copies: the network proposes nothing) is that copy's round, not a plain step."""
    if len(draft.tokens) == 0 and draft.branch_source:
        return draft.branch_source
    return round_source(draft)


def kept_source(draft: Draft, followed: list[int]) -> str:
    """Where a round's kept draft tokens came from, `followed` being the branch the target followed: the draft's own
    source (round_source), or where that is one of its alternatives, the alternative's: the other copy of a copy try,
    a copy beside the network's draft (Draft.branch_source), or another of the network's drafts (a tree)."""
    if not draft.alternatives or not followed or draft.ids[: len(followed)] == list(followed):
        return round_source(draft)
    if draft.beside is not None:
        return draft.beside[0]
    return draft.branch_source or "drafter"


@dataclass
class DraftPolicy:
    """When to call the drafter and how much of a draft to verify: the adaptive cut under the verify cost
    (clip_draft), the skips after drafts that did not pay for the drafter's call (SkipEmpty, draft_pays), the
    skips while a source measures slower than plain steps in this reply (MeasuredPays, one per source), lookup's
    measured acceptance (LookupRates) and the plain probes (PlainProbe). A policy only: whatever it decides,
    verification keeps the output exact."""

    # relative cost of 1, 2, ... positions the cut weighs: the start-up curve (core.runtime.verify_cost; () for no cut)
    # with the lengths this reply and conversation measured (RoundCosts), renewed as rounds are measured
    verify_cost: tuple[float, ...]
    # what a network draft is charged for the drafter's call in the skips (draft_pays) until this reply has measured it
    # (CallCost); 0: nothing charged (T > 0, or no cost curve)
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

    @classmethod
    def for_run(cls, gen, state: PolicyState | None = None, window: int | None = None) -> "DraftPolicy":
        """The policy of one generation (gen: core.decoding.engine.GenerationConfig), from what `state` measured before;
        window:
        the drafter's context window (Drafter.context_window), for FeatureCapture."""
        state = state or PolicyState()
        for measured in (state.drafter, state.lookup):
            measured.max_skip = gen.max_measured_wait if gen.plain_probe_every else 0
        state.lookup.confident_rounds = state.copied_patience if gen.sampling.greedy else 0
        charged = gen.draft_cost if gen.charges_draft_cost() else 0.0
        return cls(state.costs.curve(gen.verify_cost), charged, SkipEmpty(gen.max_skip if gen.verify_cost else 0),
                   PlainProbe(gen.plain_probe_every), state, start_cost=gen.verify_cost, copy_tries=gen.copy_tries,
                   try_cost=state.tries.curve(gen.verify_cost),
                   capture=None if window is None else FeatureCapture(window))

    def draft(self, drafter: Drafter, anchor: int, k: int, sampling: SamplingConfig,
              generator: torch.Generator) -> Draft:
        """This round's draft: a copied draft where one exists, pays under the cut and the measured rounds allow it
        (the one that pays most), else the network's where the policy calls it, else an empty one (a plain step)."""
        # each policy's wait runs down only while it is asked, so ask them every round, before the probe
        self.called = False
        lookup_now = self.state.lookup.draft_now()
        network_now = self.state.drafter.draft_now() and self.skip.draft_now()
        if self.probe.due():
            return self.cut(None, k)
        propose_lookups = getattr(drafter, "propose_lookups", None)  # drafters with free sources (LookupHybrid)
        if lookup_now and propose_lookups is not None:
            lookup = self.best_lookup(propose_lookups(anchor, k), k)
            if len(lookup.tokens):
                self.probe.record(plain=False)
                return lookup
        if self.capture is not None:  # a network that reads a window of features: called once it has them
            self.capture.wanted()
            network_now = network_now and self.capture.is_ready()
        if network_now and not sampling.greedy and self.sampled_cut_is_empty(k):
            network_now = False  # its draft would be cut to nothing: the call is not made, the skips back off as then
            self.skip.drafted(paid=False)
        self.called = network_now
        proposal = drafter.propose(anchor, k, sampling, generator) if network_now else None
        if proposal is not None and not sampling.greedy and proposal.confidence is not None:
            proposal = replace(proposal, confidence=self.state.sampled.rates(len(proposal.tokens)))  # (K,) measured
        return self.cut(proposal, k)

    def may_call_within(self, rounds: int) -> bool:
        """Whether the network may be called in one of the next `rounds` rounds: its measured verdict's wait and the
        skips' run down one after the other (draft asks the second only once the first is over), so the earliest
        call is their sum of rounds away; a round that called it counts too (its verdict may reset the waits). A
        feature captured earlier lies outside the network's context window by its next call and is never read."""
        return self.called or self.state.drafter.wait + self.skip.wait < rounds

    def captures(self, prefill: bool = False) -> bool:
        """Whether this forward (the prompt's prefill, or a round's) captures the drafter's features (FeatureCapture;
        every forward without one)."""
        capture = self.capture
        return capture is None or capture.captures(self.may_call_within(capture.window), prefill)

    def sampled_cut_is_empty(self, k: int) -> bool:
        """At T > 0 the network's draft is cut on its slots' measured acceptance (SlotRates), which is known before the
        call: whether that cuts any draft of up to k slots to nothing. Such calls had cost ~5 ms each and verified
        nothing (27 of 31 network calls in 24 chat replies at T = 0.7, AVX2 EPYC, 2026-12-03). Only once sampled
        drafts were measured, so a drafter without them (deterministic, or not tried yet) is called as before."""
        rates = self.state.sampled
        if not self.verify_cost or not rates.reached:
            return False
        return best_draft_length(rates.rates(k).tolist(), self.verify_cost) == 0

    def best_lookup(self, copies: tuple[Copy, ...], k: int) -> Draft:
        """Of the free sources' copies, the cut one with the most expected tokens per unit of verify cost (the first
        that keeps something without a cost curve), as the round's draft; an empty draft when none pays."""
        best, best_value, best_n = None, 1.0, 0  # a plain step: one token for one step's cost
        cuts = []
        for copy in copies:
            n, value = self.cut_copy(copy, k)
            cuts.append(n)
            if n == 0:
                continue
            if not self.verify_cost:
                return copy.draft(n)
            if value > best_value:
                best, best_value, best_n = copy, value, n
        if self.copy_tries and self.try_cost and len(copies) > 1:
            tried, value = self.best_try(copies, cuts, k)
            if value > best_value:
                return tried
        return EMPTY if best is None else best.draft(best_n)

    def best_try(self, copies: tuple[Copy, ...], cuts: list[int], k: int) -> tuple[Draft | None, float]:
        """App. D's trie with copied drafts: one copy (cut where it pays alone, else to its first token) and, as a
        second branch, another copy whose first token differs, cut where the pair's expected tokens per unit of cost
        peak (the second's acceptance as measured beside a first, LookupRates' beside keys; the cost as copy tries
        measured it, PolicyState.tries). At most one of
        the two first tokens is the target's (at T > 0 the target draws one token, core.decoding.tree.walk), so the
        second
        branch adds its expected tokens to the first's. -> (the best such draft, its expected tokens per unit of
        verify cost), (None, 0.0) where no pair fits in k nodes."""
        best, best_value = None, 0.0
        for main, n in zip(copies, cuts):
            n = max(n, 1)
            if n >= k:
                continue
            expected = expected_tokens(self.state.rates.rates(main.key, main.source, n, prior=main.prior),
                                       self.try_cost)[-1]
            for other in copies:
                if other.tokens[0] == main.tokens[0]:
                    continue
                rates = self.state.rates.rates(other.key, other.source, min(len(other.tokens), k - n), True)
                m, value = extend_cut(expected, 1 + n, rates, self.try_cost)
                if m and value > best_value:
                    best, best_value = Draft(main.tokens[:n], None, alternatives=(tuple(other.tokens[:m]),),
                                             lookup_match=main.key, lookup_source=main.source,
                                             beside=(other.source, other.key)), value
        return best, best_value

    def cut_lookup(self, copy: Copy | None, k: int) -> Draft:
        """The part of a copy worth verifying, as a draft (cut_copy); an empty draft for none."""
        if copy is None:
            return EMPTY
        n, _ = self.cut_copy(copy, k)
        return copy.draft(n) if n else EMPTY

    def cut_copy(self, copy: Copy, k: int) -> tuple[int, float]:
        """(how many of a copy's tokens to verify, the expected tokens per unit of verify cost of that prefix): with a
        cost curve, the prefix that pays at the measured acceptance of its source and match length (best_cut); without
        one, a strong match whole (lookup_plan), else nothing (the value then 1.0: not weighed). On Python floats:
        most copies are cut to nothing."""
        if not self.verify_cost:
            alone, _ = lookup_plan(copy.tokens, copy.matched)
            return (min(len(copy.tokens), k) if alone else 0), 1.0
        rates = self.state.rates.rates(copy.key, copy.source, min(len(copy.tokens), k), prior=copy.prior)
        return best_cut(rates, self.verify_cost)

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
        if source in COPIED and draft.beside is None:
            self.state.rates.record(draft.lookup_match, len(draft.tokens), n_accepted, source)
        elif source in COPIED:  # a copy try: each branch kept what it shares with the accepted tokens
            other, kept = draft.alternatives[0], accepted or []
            self.state.rates.record(draft.lookup_match, len(draft.tokens), common_prefix(draft.ids, kept), source)
            self.state.rates.record(draft.beside[1], len(other), common_prefix(other, kept), draft.beside[0],
                                    beside=True)
        if source == "drafter" and draft.q_draft is not None:  # a sampled draft (T > 0): its acceptance per slot
            self.state.sampled.record(len(draft.tokens), n_accepted)
        if not draft.alternatives:  # a chain (or nothing) fed 1 + its tokens; a tree's cost is not a chain's
            verified, fed = seconds - (draft_seconds if self.called else 0.0), 1 + len(draft.tokens)
            if self.state.costs.record(fed, verified):
                self.verify_cost = self.state.costs.renewed(self.verify_cost, self.start_cost, fed)
            if fed == 1 and self.copy_tries:  # the plain rounds the copy tries' costs are set against
                self.state.tries.record(1, verified)
        elif draft.beside is not None:  # a copy try fed the anchor and both branches
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
        draft = clip_draft(proposal, k, self.verify_cost)
        if proposal is not None and proposal.confidence is not None and self.verify_cost:  # a draft it can cut
            self.skip.drafted(draft_pays(proposal.confidence[:k], self.verify_cost, self.call_cost()))
        self.probe.record(plain=len(draft.tokens) == 0)
        return draft


def expected_tokens(confidence, verify_cost: tuple[float, ...]) -> list[float]:
    """Expected committed tokens of verifying the first n slots, n = 0..min(K, len(verify_cost) - 1):
    1 + sum_{k<=n} prod_{j<=k} c_j, with the drafter's per-slot confidence c (K,) as its acceptance estimate.
    On Python floats: a cut runs every drafting round, and a dozen tensor ops on a few slots cost ~0.3 ms a round
    here (5% of a step of the embedded default)."""
    values = confidence.tolist() if isinstance(confidence, torch.Tensor) else list(confidence)
    expected, reach = [1.0], 1.0
    for c in values[: len(verify_cost) - 1]:
        reach *= min(max(c, 0.0), 1.0)  # P(slots 1..k all accepted)
        expected.append(expected[-1] + reach)
    return expected


def best_cut(confidence, verify_cost: tuple[float, ...]) -> tuple[int, float]:
    """(the prefix length n maximising expected committed tokens per unit of verify cost,
    (1 + sum_{k<=n} prod_{j<=k} c_j) / cost(n + 1 positions), with the drafter's per-slot confidence c as its
    acceptance estimate; that maximum), the first n on a tie, 0 where no prefix beats a plain step. One pass on Python
    floats: a copy is cut every round."""
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


def best_draft_length(confidence, verify_cost: tuple[float, ...]) -> int:
    """The prefix length n maximising expected committed tokens per unit of verify cost (best_cut). A policy only:
    whatever length it picks, verification keeps the output exact."""
    return best_cut(confidence, verify_cost)[0]


def draft_pays(confidence, verify_cost: tuple[float, ...], draft_cost: float) -> bool:
    """Whether drafting beats a plain step in expected tokens per unit of cost when the drafter's own call is paid
    too: max over n >= 1 of (1 + sum_{k<=n} prod_{j<=k} c_j) / (cost(n + 1) + draft_cost) > 1 / cost(1) = 1.
    With draft_cost = 0 this is "the cut keeps something" (best_draft_length > 0). The draft in hand is sunk, so
    its cut ignores draft_cost; this only tells the skip policy whether the next call is likely worth making."""
    expected = expected_tokens(confidence, verify_cost)
    return any(tokens / (cost + draft_cost) > 1.0 for tokens, cost in zip(expected[1:], verify_cost[1:]))


def clip_draft(draft: Draft | None, k: int, verify_cost: tuple[float, ...] = ()) -> Draft:
    """No draft -> an empty one; a drafter that overshoots the room left is cut to k slots; with a cost
    curve, a draft with confidences is cut to its best expected length. (Alternatives are cut by the
    trie's node budget, round_trie.)"""
    if draft is None:
        return EMPTY
    if verify_cost and draft.confidence is not None:
        k = min(k, best_draft_length(draft.confidence, verify_cost))
    if len(draft.tokens) <= k:
        return draft
    cut = lambda x: None if x is None else x[:k]  # noqa: E731
    return replace(draft, tokens=draft.tokens[:k], q_draft=cut(draft.q_draft), confidence=cut(draft.confidence))


