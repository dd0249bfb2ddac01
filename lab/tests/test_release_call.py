import pytest

from lab.release_call import summary


def test_each_arm_is_read_against_torchs_at_the_same_rows_and_the_confidence_against_torchs():
    ms = {"torch, 16 rows": [8.0, 6.0, 7.0], "native 8-bit, 16 rows": [3.0, 4.0, 3.5], "torch, 4 rows": [5.0],
          "native 8-bit, 4 rows": [2.0], "confidence torch": [1.0, 1.2, 1.4], "confidence native": [0.1, 0.3, 0.2]}
    out = summary(ms)
    assert out["ms"]["torch, 16 rows"] == 7.0 and out["ms"]["native 8-bit, 16 rows"] == 3.5
    assert out["of_torch"]["native 8-bit, 16 rows"] == pytest.approx(0.5)
    assert out["of_torch"]["native 8-bit, 4 rows"] == pytest.approx(0.4)
    assert out["of_torch"]["confidence native"] == pytest.approx(0.2 / 1.2)
