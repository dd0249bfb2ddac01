from dataclasses import replace

import pytest

from core.drafting.policy.config import DEFAULTS
from lab.round_costs_ab import ARMS, StartUpOnly, steeper, summary


def test_summary_gives_each_arm_over_plain_and_each_measured_arm_over_its_start_up_only_twin():
    speeds = {"plain": 100.0, "measured": 110.0, "start-up only": 100.0, "measured, steep start": 105.0,
              "start-up only, steep start": 84.0}
    rows = [speeds, {arm: value / 2 for arm, value in speeds.items()}]
    out = summary(rows)
    assert out["measured / plain"]["mean"] == pytest.approx(1.1) and out["measured / plain"]["se"] < 1e-9
    assert out["measured, steep start / start-up only, steep start"]["mean"] == pytest.approx(1.25)
    assert "start-up only / measured" not in out and len(out) == 4 + 2  # the arms that ran, two of them paired
    two = summary([{"plain": 100.0, "measured": 110.0, "measured, 64 rounds": 121.0}] * 2)
    assert two["measured, 64 rounds / measured"]["mean"] == pytest.approx(1.1) and len(two) == 3
    assert ARMS["measured, 64 rounds"][0]().cfg.cost_window == 64


def test_the_steep_start_is_half_again_as_steep_and_the_start_up_arm_never_measures():
    assert steeper((1.0, 1.2, 1.5)) == pytest.approx((1.0, 1.3, 1.75))
    costs = StartUpOnly(replace(DEFAULTS, cost_min_rounds=1))
    for fed in (1, 1, 2, 2):
        assert costs.record(fed, 0.01 * fed) is False
    assert costs.curve((1.0, 1.1)) == (1.0, 1.1)
