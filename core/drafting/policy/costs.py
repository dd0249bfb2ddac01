"""What drafting costs in this reply, in plain rounds: a call of the network (CallCost) and a round that fed n
positions (RoundCosts), each measured against the plain rounds of its own time, with the start-up estimates
(core.runtime.verify_cost) until enough rounds were measured. Past rounds' timings only: exact at every temperature."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.drafting.policy.config import DEFAULTS


@dataclass
class CallCost:
    """What a call of the network costs, in plain steps: the median of its recent calls' seconds over the median plain
    round's (the plain rounds MeasuredPays keeps). The start-up estimate times a warm drafter beside one-position
    forwards; in a reply each call first projects every position committed since the last one and its weights come
    back from memory, so calls cost more there (docs/journal/engine.md)."""

    window: int = DEFAULTS.call_window
    min_calls: int = DEFAULTS.call_min
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
    over the median plain round's at the time, once `min_rounds` of them were measured, weighed against the start-up
    curve by the rounds behind it. Each round is set against the plain rounds of its own time because a shared
    machine's speed moves within minutes. The start-up curve times bare forwards once, in a few seconds; a copied
    round also pays the Python around its forward (docs/journal/engine.md, lab.round_costs_ab). A length found dear is
    verified less and so measured less: its window keeps the last rounds that fed it."""

    window: int = DEFAULTS.cost_window
    min_rounds: int = DEFAULTS.cost_min_rounds
    prior_weight: float = DEFAULTS.curve_weight  # the start-up curve counts as this many rounds (curve)
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
        m / (m + prior_weight); `start`'s elsewhere; () for no cost curve (no cut)."""
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
