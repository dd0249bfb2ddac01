import time

import pytest

from lab.call_cost_ab import ChargedClock


def test_the_clock_leaves_out_the_uncharged_part_of_each_call():
    clock = ChargedClock()
    clock.fraction = 0.25
    slow = clock.charging(lambda: time.sleep(0.04) or "draft")
    start, real = clock(), time.perf_counter()
    assert slow() == "draft"
    charged, elapsed = clock() - start, time.perf_counter() - real
    assert clock.saved == pytest.approx(0.75 * 0.04, rel=0.5)
    assert charged == pytest.approx(elapsed - clock.saved, abs=1e-3)
    clock.fraction, clock.saved = 1.0, 0.0
    slow()
    assert clock.saved == 0.0  # charged whole: the clock is perf_counter
