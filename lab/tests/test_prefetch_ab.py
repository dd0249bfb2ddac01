import pytest

from lab.prefetch_ab import forward_summary


def test_each_distance_s_forwards_are_read_against_no_prefetch_paired_by_iteration():
    ms = {0: {1: [10.0, 20.0], 2: [12.0, 12.0], 5: [30.0, 30.0]},
          2: {1: [9.0, 16.0], 2: [12.0, 6.0], 5: [30.0, 33.0]}}
    out = forward_summary(ms, 0)
    assert out["2 blocks, 1 positions"]["over none"]["mean"] == pytest.approx((0.9 + 0.8) / 2)
    assert out["2 blocks, 2 positions"]["median_ms"] == pytest.approx(9.0)
    assert out["0 blocks, 5 positions"]["over none"] == {"mean": 1.0, "se": 0.0}
