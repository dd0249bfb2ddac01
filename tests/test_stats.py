import pytest

from core.decoding.stats import AcceptanceStats, speedup, speedup_se
from lab.testing import event


def test_acceptance_stats_condition_on_earlier_slots():
    def ev(drafted, n):
        return event(drafted=tuple(drafted), n_accepted=n)

    events = [ev([1, 2, 3], 3), ev([1, 2, 3], 1), ev([1, 2, 3], 0), event(kind="prefill"),
              event(finish_reason="cancelled")]
    stats = AcceptanceStats().add_all(events)
    assert (stats.rounds, stats.committed) == (3, 4 + 2 + 1)
    assert stats.reached[:3] == [3, 2, 1] and stats.accepted[:3] == [2, 1, 1]
    assert stats.per_slot(4) == [2 / 3, 1 / 2, 1.0, None] and stats.per_slot() == [2 / 3, 1 / 2, 1.0]


def test_each_source_s_share_of_the_reply_s_tokens():
    """Accepted draft tokens count to the round's source, every other committed token (the prefill's, each round's
    own from the target, plain steps) to the target; a round cut short by the end counts only what it committed."""
    events = [event(kind="prefill", committed=(5,)), event(drafted=(1, 2, 3), n_accepted=2, committed=(1, 2, 9),
                                                            source="drafter"),
              event(drafted=(4, 5), n_accepted=2, committed=(4, 5, 6), source="phrasebook"),
              event(committed=(7,)), event(drafted=(8, 8), n_accepted=2, committed=(8,), source="lookup",
                                           finish_reason="length")]
    stats = AcceptanceStats().add_all(events)
    assert stats.tokens == {"target": 4, "drafter": 2, "phrasebook": 2, "lookup": 1}
    assert stats.token_shares() == pytest.approx({"target": 4 / 9, "drafter": 2 / 9, "phrasebook": 2 / 9,
                                                  "lookup": 1 / 9})
    assert AcceptanceStats().token_shares() == {}


def replay(intervals_and_drafts):
    """A ReplySpeed fed rounds of (seconds, drafted tokens, accepted) after a prefill at t = 0."""
    from core.decoding.stats import ReplySpeed

    speed, now = ReplySpeed(), 0.0
    speed.add(event(kind="prefill", committed=(1,)), now)
    for seconds, drafted, accepted in intervals_and_drafts:
        now += seconds
        speed.add(event(drafted=tuple(range(drafted)), n_accepted=accepted, committed=(1,) * (accepted + 1)), now)
    return speed


def test_a_plain_reply_is_one_times_plain_decoding():
    speed = replay([(0.04 + 0.001 * (i % 3), 0, 0) for i in range(40)])
    assert abs(speed.ratio - 1.0) < 0.02 and len(speed.plain_steps) == 40


def test_the_ratio_follows_drafting_and_ignores_a_load_change():
    """Rounds committing 3 tokens at 1.5x a plain step's time are 2x plain decoding, before and after the machine
    gets 10x slower; a drafter that never helps stays below 1x whichever way the load changes."""
    fast, slow = 0.01, 0.1
    helpful = [(1.5 * fast, 4, 2)] * 15 + [(fast, 0, 0)] + [(1.5 * slow, 4, 2)] * 15 + [(slow, 0, 0)]
    speed = replay([(fast, 0, 0)] + helpful * 3)
    assert abs(speed.ratio - 2.0) < 0.05
    for load in ([fast] * 50 + [slow] * 50, [slow] * 50 + [fast] * 50):
        useless = [(1.2 * t, 4, 0) if i % 16 else (t, 0, 0) for i, t in enumerate(load)]
        assert replay(useless).ratio < 1.0
    assert replay([(fast, 4, 0)] * 10).ratio is None  # no plain step: no ratio, rather than a guess


def test_speedup_pools_runs_and_its_jackknife_error_tracks_the_spread():
    base = [(100, 1.0), (100, 1.0), (100, 1.0), (100, 1.0)]
    assert speedup(base, [(100, 0.5)] * 4) == pytest.approx(2.0)
    assert speedup_se(base, [(100, 0.5)] * 4) == pytest.approx(0.0)  # every prompt agrees: no spread
    assert speedup_se(base[:2], [(100, 0.5)] * 2) is None  # too few prompts to say
    spread = [(100, 0.4), (100, 0.6), (100, 0.45), (100, 0.55)]
    wider = [(100, 0.3), (100, 0.7), (100, 0.35), (100, 0.65)]
    assert 0 < speedup_se(base, spread) < speedup_se(base, wider)
    # the jackknife of a ratio of sums: by hand for three prompts
    three_base, three_spec = base[:3], [(100, 0.5), (100, 1.0), (100, 0.25)]
    leave_out = [200 / 1.25, 200 / 0.75, 200 / 1.5]  # spec tokens/s over base's 100 tokens/s, one prompt left out
    leave_out = [x / 100 for x in leave_out]
    mean = sum(leave_out) / 3
    want = (2 / 3 * sum((x - mean) ** 2 for x in leave_out)) ** 0.5
    assert speedup_se(three_base, three_spec) == pytest.approx(want)
