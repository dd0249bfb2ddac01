import pytest

from lab.harness import rotated
from lab.long_chat_ab import summary


def test_summary_pairs_the_two_curves_turn_by_turn():
    rows = [{"one curve": 1.0, "per context": 1.1}, {"one curve": 1.4, "per context": 1.5},
            {"one curve": 0.8, "per context": 0.9}]
    out = summary(rows)
    assert out["one curve"]["mean"] == pytest.approx(3.2 / 3) and out["per context"]["mean"] == pytest.approx(3.5 / 3)
    # each turn's sides differ by exactly 0.1: the paired difference has no spread where the sides' means do
    assert out["per context - one curve"]["mean"] == pytest.approx(0.1)
    assert out["per context - one curve"]["se"] < 1e-9 < out["one curve"]["se"]


def test_the_arms_take_turns_going_first():
    assert [rotated([0, 2, 3], i)[0] for i in range(4)] == [0, 2, 3, 0]
    assert sorted(rotated([0, 2, 3], 2)) == [0, 2, 3]
