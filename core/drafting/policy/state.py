"""The policy's one store of what drafting measured, carried from a reply to the conversation's next (the app keeps one
per drafter): each source's verdict against plain steps (Verdict), the drafted tokens' acceptance (Acceptance), and
what rounds and network calls cost (Costs). Past rounds only, never the token being verified: the output stays exact."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from core.drafting.policy.config import DEFAULTS, PolicyConfig

WAITING = "waiting: its last rounds did not pay"
MEASURING = "waiting: plain steps are measured first"


@dataclass
class Verdict:
    """Whether a source's rounds pay, so when it may draft. Where it `measures`: its last `window` rounds' tokens a
    second against as many plain rounds' (a stall clipped to cfg.stall mean plain rounds), alternating with plain
    rounds until cfg.min_rounds of each are in. A round that lost (measured slower, or a network draft whose cut did not
    pay for its call) backs it off 1, 2, 4 ... rounds up to `max_wait` (0: never); once `patience` rounds measured
    losing, long enough to keep retries within cfg.try_budget of the reply (at most cfg.longest_wait)."""

    cfg: PolicyConfig = DEFAULTS
    window: int = DEFAULTS.network_window
    max_wait: int = DEFAULTS.max_skip  # these three: the reply's (DraftPolicy.for_run)
    measures: bool = False  # (only where max_wait > 0)
    patience: int = 0
    losses: int = 0  # its rounds in a row that lost
    wait: int = 0  # rounds it still waits
    drafted_rounds: list = field(default_factory=list)  # (tokens committed, seconds) of its recent rounds
    plain_rounds: list = field(default_factory=list)  # the same of recent plain rounds
    # per kind (drafted or not), its kept rounds' [tokens, seconds] summed, kept as rounds come and go
    totals: dict = field(default_factory=lambda: {True: [0, 0.0], False: [0, 0.0]}, repr=False, compare=False)

    def hold(self) -> str:
        """Why the source may not draft this round, "" where it may (asked once a round: it runs the wait down)."""
        if self.wait > 0:
            self.wait -= 1
            return WAITING
        plain, drafted = len(self.plain_rounds), len(self.drafted_rounds)
        return MEASURING if self.measures and plain < self.cfg.min_rounds and drafted > plain else ""

    def ratio(self) -> float | None:
        """Its rounds' tokens a second over plain rounds'; None before min_rounds of each, or if it doesn't measure."""
        if not self.measures or min(len(self.drafted_rounds), len(self.plain_rounds)) < self.cfg.min_rounds:
            return None
        (tokens, seconds), (plain_tokens, plain_seconds) = self.totals[True], self.totals[False]
        return tokens * plain_seconds / (seconds * plain_tokens) if seconds * plain_tokens > 0 else float("inf")

    def observe(self, drafted: bool, committed: int, seconds: float, paid: bool = True) -> None:
        """A round of the source (drafted) or a plain one; `paid`: whether its draft's cut paid for its call."""
        if len(self.plain_rounds) >= self.cfg.min_rounds:
            seconds = min(seconds, self.cfg.stall * self.totals[False][1] / len(self.plain_rounds))
        rounds, total = (self.drafted_rounds if drafted else self.plain_rounds), self.totals[drafted]
        rounds.append((committed, seconds))
        total[0], total[1] = total[0] + committed, total[1] + seconds
        while len(rounds) > self.window:
            gone_tokens, gone_seconds = rounds.pop(0)
            total[0], total[1] = total[0] - gone_tokens, total[1] - gone_seconds
        if drafted and self.max_wait:
            ratio = self.ratio()
            self.settle(paid and (ratio is None or ratio >= 1))
            if ratio is not None and ratio < 1 and len(self.drafted_rounds) >= self.patience:
                tokens = self.totals[True][0] / len(self.drafted_rounds)
                self.wait = max(self.wait, min(self.budget_wait(ratio, tokens), self.cfg.longest_wait))

    def settle(self, paid: bool) -> None:  # a round that paid ends the back-off, one that lost doubles it
        self.losses = 0 if paid else self.losses + 1
        self.wait = min(2 ** (self.losses - 1), self.max_wait) if self.losses else 0

    def budget_wait(self, ratio: float, tokens: float = 1.0) -> int:
        """Rounds to wait after rounds at `ratio` of plain rate, `tokens` each: tokens * (1 / ratio - 1) plain rounds
        lost a round, which must stay within cfg.try_budget of the rounds."""
        return math.ceil(tokens * (1 / max(ratio, 1e-3) - 1) / self.cfg.try_budget)


@dataclass
class Acceptance:
    """How often drafted tokens were kept, per source, key (lookup's match length, a phrasebook grade, the tail's
    confidence; 0: the network's sampled drafts) and slot, Beta-smoothed towards the source's prior for the slot (a
    grade's calibration, cfg.sampled_prior), else the slot before's (slot 1: cfg.copy_prior): a copy stays on track."""

    cfg: PolicyConfig = DEFAULTS
    counts: dict[tuple, list] = field(default_factory=dict)  # per key, per slot: [verified that far, of those kept]
    _rates: dict[tuple, list] = field(default_factory=dict, repr=False, compare=False)  # kept until the key records

    def key(self, source: str, matched: int) -> tuple:  # prompt lookup's matches are keyed up to lookup_strong
        return source, min(matched, self.cfg.lookup_strong) if source == "lookup" else matched

    def rates(self, source: str, matched: int, n: int, prior: tuple[float, ...] = ()) -> list[float]:
        """The first n slots' acceptance, each given the earlier ones kept (a key is always read with one prior)."""
        key, prior = self.key(source, matched), (self.cfg.sampled_prior,) * n if source == "drafter" else prior
        if len(self._rates.get(key, ())) < n:
            counts, out, weight = self.counts.get(key, []), [self.cfg.copy_prior], self.cfg.prior_weight
            for k in range(n):
                seen, kept = counts[k] if k < len(counts) else (0.0, 0.0)
                out.append((kept + (prior[k] if k < len(prior) else out[-1]) * weight) / (seen + weight))
            self._rates[key] = out[1:]
        return self._rates[key][:n]

    def record(self, source: str, matched: int, n_verified: int, n_accepted: int) -> None:
        """A verified draft of n_verified tokens kept n_accepted: the slots up to the first rejection were reached."""
        key = self.key(source, matched)
        counts = self.counts.setdefault(key, [])
        counts += [[0.0, 0.0] for _ in range(n_verified - len(counts))]
        for k in range(min(n_accepted + 1, n_verified)):
            counts[k][0] += 1
            counts[k][1] += k < n_accepted
        self._rates.pop(key, None)


@dataclass
class Costs:
    """What drafting costs in plain rounds: a round that fed n positions (its call aside) and, as n = 0, a network call,
    each the median of its last rounds over the median plain round of their time (a shared machine's speed moves),
    weighed against the start-up curve (core.runtime.verify_cost) as cfg.curve_weight rounds."""

    cfg: PolicyConfig = DEFAULTS
    plain: list = field(default_factory=list)  # seconds of recent plain rounds
    step: float = 0.0  # their median, once measured
    ratios: dict[int, list] = field(default_factory=dict)  # positions fed (0: a call) -> recent costs in plain rounds
    medians: dict[int, float] = field(default_factory=dict)  # the median of those, once measured

    def record(self, fed: int, seconds: float) -> bool:
        """A round that fed `fed` positions (0: a network call) took `seconds`; whether a measured cost changed."""
        if fed == 1:
            self.plain = [*self.plain, seconds][-self.cfg.cost_window:]
            self.step = sorted(self.plain)[len(self.plain) // 2] if len(self.plain) >= self.cfg.cost_min_rounds else 0.0
        elif self.step > 0:
            ratios = self.ratios[fed] = [*self.ratios.get(fed, []), seconds / self.step][-self.cfg.cost_window:]
            if len(ratios) >= self.cfg.cost_min_rounds:
                self.medians[fed] = sorted(ratios)[len(ratios) // 2]
                return True
        return False

    def weighed(self, n: int, start: float) -> float:
        """A measured length's cost within its bounds, weighed against the start-up curve's `start` for it."""
        measured, rounds, weight = min(max(self.medians[n], 1.0), float(n)), len(self.ratios[n]), self.cfg.curve_weight
        return (rounds * measured + weight * start) / (rounds + weight)

    def curve(self, start: tuple[float, ...]) -> tuple[float, ...]:
        """The cost of 1, 2, ... positions: `start`'s with each measured length weighed in; () for no curve (no cut)."""
        return tuple(self.weighed(n, cost) if n in self.medians else cost for n, cost in enumerate(start, start=1))


@dataclass
class PolicyState:
    """The store (module docstring); PolicyState.of(cfg) has cfg's windows and priors, PolicyState() the defaults'."""

    network: Verdict = field(default_factory=Verdict)
    copies: Verdict = field(default_factory=lambda: Verdict(window=DEFAULTS.copied_window))
    acceptance: Acceptance = field(default_factory=Acceptance)
    costs: Costs = field(default_factory=Costs)

    @classmethod
    def of(cls, cfg: PolicyConfig) -> "PolicyState":
        return cls(Verdict(cfg, cfg.network_window), Verdict(cfg, cfg.copied_window), Acceptance(cfg), Costs(cfg))
