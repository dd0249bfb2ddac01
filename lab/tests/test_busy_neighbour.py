from lab.busy_neighbour import summary


def test_each_phase_reads_as_its_median_and_range():
    out = summary({"busy": [40.0, 16.0, 200.0, 35.0], "alone": [100.0, 250.0, 180.0]})
    assert out["busy"] == {"median": 37.5, "min": 16.0, "max": 200.0}
    assert out["alone"] == {"median": 180.0, "min": 100.0, "max": 250.0}
