from lab.commits_ab import summary


def rows(seconds: float, plain_seconds: float, tokens=(1, 2, 3)) -> list[dict]:
    return [{"tokens": list(tokens), "s": seconds, "plain_tokens": [1, 2, 3], "plain_s": plain_seconds}] * 2


def test_the_summary_pairs_sides_by_prompt_and_divides_the_drift_out():
    """A head whose processes ran 10% faster everywhere (plain decoding too) changed nothing: its speed-up over plain
    is the base's; a reply that differs is reported."""
    base, head = [rows(1.0, 2.0)], [rows(0.9, 1.8)]
    out = summary({"base": base, "head": head, "control": [rows(1.0, 2.0)]})
    assert out["replies_identical_at_both_commits"] and out["default_equals_plain"]
    assert round(out["default head / base"]["mean"], 3) == round(1 / 0.9, 3)
    assert out["speed-up over plain head / base"]["mean"] == 1.0
    assert out["speed-up over plain control / base (same build)"]["pairs"] == 2
    changed = summary({"base": base, "head": [rows(1.0, 2.0, tokens=(1, 2, 4))]})
    assert not changed["replies_identical_at_both_commits"]
