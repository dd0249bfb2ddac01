"""Acceptance statistics from engine events, shared by the bench and the UI."""
from __future__ import annotations

from dataclasses import dataclass, field

from app.engine import MAX_BLOCK_SIZE, RoundEvent


@dataclass
class AcceptanceStats:
    """Tokens committed per target forward (bonus included) and conditional per-slot acceptance:
    accepted[k] / reached[k] is the rate at slot k+1 given that every earlier slot was accepted."""

    rounds: int = 0
    committed: int = 0
    reached: list[int] = field(default_factory=lambda: [0] * MAX_BLOCK_SIZE)
    accepted: list[int] = field(default_factory=lambda: [0] * MAX_BLOCK_SIZE)

    def add(self, ev: RoundEvent) -> None:
        if ev.kind != "round" or ev.finish_reason == "cancelled":
            return  # prefill commits one token whatever the drafter; a cancelled round did no forward
        self.rounds += 1
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

    @property
    def acceptance_length(self) -> float | None:
        return self.committed / self.rounds if self.rounds else None

    def per_slot(self, block_size: int | None = None) -> list[float | None]:
        """Rate per slot 1..block_size (None where no round reached the slot)."""
        n = block_size or max((k + 1 for k, r in enumerate(self.reached) if r), default=0)
        return [a / r if r else None for a, r in zip(self.accepted[:n], self.reached[:n])]
