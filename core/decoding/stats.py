"""Acceptance statistics from engine events, shared by the bench and the UI."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.decoding.engine import RoundEvent
from core.drafting.base import MAX_BLOCK_SIZE


@dataclass
class AcceptanceStats:
    """Tokens committed per target forward (bonus included) and conditional per-slot acceptance:
    accepted[k] / reached[k] is the rate at slot k+1 given that every earlier slot was accepted."""

    rounds: int = 0
    committed: int = 0
    reached: list[int] = field(default_factory=lambda: [0] * MAX_BLOCK_SIZE)
    accepted: list[int] = field(default_factory=lambda: [0] * MAX_BLOCK_SIZE)
    sources: dict[str, int] = field(default_factory=dict)  # rounds by what they verified (RoundEvent.source)
    # the reply's tokens by where they came from: a round's accepted draft tokens by its source, every other token
    # (the prefill's, each round's own from the target, plain steps) as "target"
    tokens: dict[str, int] = field(default_factory=dict)
    # the rounds that verified nothing by why (their Decision's reasons: "copies ...; network ..."), where known
    plain_reasons: dict[str, int] = field(default_factory=dict)

    def add(self, ev: RoundEvent) -> None:
        drafted = min(ev.n_accepted, len(ev.committed)) if ev.kind == "round" else 0
        for source, n in ((ev.kept_from or ev.source, drafted), ("target", len(ev.committed) - drafted)):
            if n:
                self.tokens[source] = self.tokens.get(source, 0) + n
        if ev.kind != "round" or ev.finish_reason == "cancelled":
            return  # prefill commits one token whatever the drafter; a cancelled round did no forward
        self.rounds += 1
        self.sources[ev.source] = self.sources.get(ev.source, 0) + 1
        if ev.source == "plain" and ev.decision is not None:
            why = ev.decision.why()
            self.plain_reasons[why] = self.plain_reasons.get(why, 0) + 1
        self.committed += ev.n_accepted + 1
        for slot in range(len(ev.drafted)):
            self.reached[slot] += 1
            if slot >= ev.n_accepted:
                break
            self.accepted[slot] += 1

    def add_all(self, events) -> "AcceptanceStats":
        for ev in events:
            self.add(ev)
        return self

    def token_shares(self) -> dict[str, float]:
        """Each source's share of the tokens so far (they sum to 1; empty before any)."""
        total = sum(self.tokens.values())
        return {source: n / total for source, n in self.tokens.items()} if total else {}

    @property
    def acceptance_length(self) -> float | None:
        return self.committed / self.rounds if self.rounds else None

    def per_slot(self, block_size: int | None = None) -> list[float | None]:
        """Rate per slot 1..block_size (None where no round reached the slot)."""
        n = block_size or max((k + 1 for k, r in enumerate(self.reached) if r), default=0)
        return [a / r if r else None for a, r in zip(self.accepted[:n], self.reached[:n])]


MIN_PLAIN_STEPS = 3  # plain steps a reply needs before its speed ratio is shown
STABLE = 1.5  # two neighbouring plain steps further apart than this factor: the load changed between them


@dataclass
class ReplySpeed:
    """One reply's decoding speed and its ratio to plain decoding measured inside the same reply, from the arrival
    times of its events, so the two are compared under the same load whatever the machine does meanwhile.

    Plain steps are the reply's rounds with an empty draft (the drafter's own time taken off; the engine makes one
    at least every `plain_probe_every` rounds). The ratio counts, between each two neighbouring plain steps, the
    tokens the reply committed against the plain steps that would have fit in the same time (their mean step);
    a stretch whose two plain steps differ by more than STABLE x (the load changed within it) is left out. Every
    per-round cost, the UI's included, falls on both sides alike; a plain reply's ratio is 1."""

    started: float | None = None  # when the prefill event arrived
    last: float | None = None
    tokens: int = 0
    rounds: list[tuple[float, int, bool]] = field(default_factory=list)  # (seconds, tokens, plain step) per round

    def add(self, ev: RoundEvent, now: float) -> None:
        if ev.kind == "prefill" or self.last is None:
            self.started = self.last = now
            return
        interval, self.last = now - self.last, now
        if ev.finish_reason == "cancelled":
            return
        self.tokens += len(ev.committed)
        plain = ev.kind == "round" and not ev.drafted and len(ev.committed) == 1  # a server's chunks are not steps
        self.rounds.append((max(interval - ev.draft_s, 1e-9) if plain else interval, len(ev.committed), plain))

    @property
    def plain_steps(self) -> list[float]:
        return [seconds for seconds, _, plain in self.rounds if plain]

    @property
    def tokens_per_s(self) -> float | None:
        elapsed = (self.last or 0.0) - (self.started or 0.0)
        return self.tokens / elapsed if self.tokens and elapsed > 0 else None

    def compared(self) -> tuple[int, float]:
        """(tokens, plain steps' worth of time) over the stretches between stable neighbouring plain steps."""
        marks = [i for i, (_, _, plain) in enumerate(self.rounds) if plain]
        tokens, plain_steps = 0, 0.0
        for a, b in zip(marks, marks[1:]):
            step_a, step_b = self.rounds[a][0], self.rounds[b][0]
            if max(step_a, step_b) > STABLE * min(step_a, step_b):
                continue
            step = (step_a + step_b) / 2
            for seconds, n, _ in self.rounds[a + 1 : b + 1]:
                tokens, plain_steps = tokens + n, plain_steps + seconds / step
        return tokens, plain_steps

    @property
    def ratio(self) -> float | None:
        if len(self.plain_steps) < MIN_PLAIN_STEPS:
            return None
        tokens, plain_steps = self.compared()
        return tokens / plain_steps if plain_steps else None

    @property
    def plain_tokens_per_s(self) -> float | None:
        """Plain decoding's speed under this reply's conditions (its speed divided by the ratio)."""
        spec, ratio = self.tokens_per_s, self.ratio
        return spec / ratio if spec and ratio else None


def pooled_rate(runs: list[tuple[int, float]]) -> float:
    """Tokens a second pooled over (tokens, seconds) runs."""
    return sum(tokens for tokens, _ in runs) / sum(seconds for _, seconds in runs)


def speedup(base: list[tuple[int, float]], spec: list[tuple[int, float]]) -> float:
    """Tokens a second of the drafted runs over the plain runs', each pooled over its runs."""
    return pooled_rate(spec) / pooled_rate(base)


def speedup_se(base: list[tuple[int, float]], spec: list[tuple[int, float]]) -> float | None:
    """The jackknife standard error of `speedup` over paired prompts (prompt i's plain and drafted runs left out
    together); None for fewer than 3 prompts. At T > 0 the two sides sample different replies, whose lengths and
    contexts differ, and single runs of 8 prompts moved by several percent: this says by how much."""
    n = len(base)
    if n < 3:
        return None
    leave_out = [speedup(base[:i] + base[i + 1:], spec[:i] + spec[i + 1:]) for i in range(n)]
    mean = sum(leave_out) / n
    return ((n - 1) / n * sum((x - mean) ** 2 for x in leave_out)) ** 0.5
