"""When a source may draft this round: the back-off after drafts that did not pay (SkipEmpty), the plain probes
(PlainProbe), the measured verdict against plain steps (MeasuredPays), and when the network has the features it reads
(FeatureCapture). Policies only: a round they hold back verifies an empty draft, so the output stays exact, and each
decides from past rounds (their committed tokens and timings), never from the token being verified."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from core.drafting.policy.config import DEFAULTS

HELD_WAIT = "wait"  # MeasuredPays.held: a back-off or a budget wait is running
HELD_MEASURING = "measuring"  # MeasuredPays.held: plain steps are measured first, so both kinds have timings


@dataclass
class SkipEmpty:
    """When to call the drafter: after `empty` drafts in a row that did not pay for themselves (cut.draft_pays), skip
    the next min(2^(empty-1), max_skip) rounds, which are then plain steps; a draft that paid resets it."""

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
class PlainProbe:
    """When to make a round a plain step without calling the drafter: after `every` rounds in a row that all
    drafted something (0: never). It costs at most one round's drafting in `every`."""

    every: int
    since_plain: int = 0

    def due(self) -> bool:
        return self.every > 0 and self.since_plain >= self.every

    def record(self, plain: bool) -> None:
        self.since_plain = 0 if plain else self.since_plain + 1


@dataclass
class MeasuredPays(SkipEmpty):
    """Whether a source pays in wall time, as measured in this reply: tokens committed per second by its rounds against
    the rounds that did not draft (plain steps, which the plain probes guarantee), over the last `window` rounds of
    each kind. While its rounds commit fewer tokens a second than plain steps, skip it for 1, 2, 4, ... up to
    `max_skip` rounds (SkipEmpty's back-off with a measured verdict), then draft once more to measure again; a round
    that pays resets the wait. Once `confident_rounds` of its rounds lost, the wait is what keeps its tries within
    `budget` of the reply's time (budget_wait), up to `longest_wait`. It sees everything a draft costs (the call, the
    longer verify, the cut). 0 max_skip: never skips. Constants: config.PolicyConfig."""

    max_skip: int = DEFAULTS.max_measured_wait
    window: int = DEFAULTS.network_window
    min_rounds: int = DEFAULTS.min_rounds
    budget: float = DEFAULTS.try_budget
    longest_wait: int = DEFAULTS.longest_wait
    stall: float = DEFAULTS.stall
    confident_rounds: int = 0  # losing rounds before the budget's wait (0: from the first verdict)
    held: str = ""  # why draft_now last said no: HELD_WAIT or HELD_MEASURING ("" when it said yes)
    drafted_rounds: list = field(default_factory=list)  # (tokens committed, seconds) of recent drafting rounds
    plain_rounds: list = field(default_factory=list)  # (tokens committed, seconds) of recent plain rounds
    # per kind: the kept rounds' (tokens, seconds) summed, kept as rounds come and go
    _sums: dict = field(default_factory=lambda: {True: [0, 0.0], False: [0, 0.0]}, repr=False, compare=False)

    @property
    def losses(self) -> int:
        """Drafting rounds in a row measured slower than plain steps."""
        return self.empty

    def draft_now(self) -> bool:
        if not super().draft_now():
            self.held = HELD_WAIT
            return False
        # the first rounds alternate until both kinds are measured, so a verdict comes within a few rounds
        plain, drafted = len(self.plain_rounds), len(self.drafted_rounds)
        measuring = bool(self.max_skip and plain < self.min_rounds and drafted > plain)
        self.held = HELD_MEASURING if measuring else ""
        return not measuring

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


@dataclass
class FeatureCapture:
    """When the engine captures the network's features (core.decoding.engine.captures) and when the network has
    enough of them to be called. It is asked only in rounds where no copy pays, yet features captured in every
    forward cost every forward: the prompt's prefill captures (the network starts with its context), then only the
    `armed` forwards after a round that wanted the network, and after a gap the network is called only once `ready`
    forwards in a row captured its context again. A drafter that is all network wants it every round and so captures
    every forward. The logits are the same either way."""

    window: int  # the positions before the anchor whose features the network reads (Drafter.context_window)
    armed: int = DEFAULTS.capture_armed
    ready: int = DEFAULTS.capture_ready
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
