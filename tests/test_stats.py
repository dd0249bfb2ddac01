from app.engine import RoundEvent
from app.stats import AcceptanceStats


def test_acceptance_stats_condition_on_earlier_slots():
    def ev(drafted, n):
        return RoundEvent("round", tuple(drafted), n, 0, (), "", 0.0, 0.0)

    events = [ev([1, 2, 3], 3), ev([1, 2, 3], 1), ev([1, 2, 3], 0), RoundEvent("prefill", (), 0, 0, (), "", 0, 0),
              RoundEvent("round", (), 0, 0, (), "", 0, 0, "cancelled")]
    stats = AcceptanceStats().add_all(events)
    assert (stats.rounds, stats.committed) == (3, 4 + 2 + 1)
    assert stats.reached[:3] == [3, 2, 1] and stats.accepted[:3] == [2, 1, 1]
    assert stats.per_slot(4) == [2 / 3, 1 / 2, 1.0, None] and stats.per_slot() == [2 / 3, 1 / 2, 1.0]
