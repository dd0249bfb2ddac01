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


def test_the_commits_recorded_are_those_checked_out_even_when_head_moves_during_the_run(monkeypatch, tmp_path):
    import json

    from lab import commits_ab

    heads = iter(["a" * 40, "b" * 40, "c" * 40])  # HEAD moves on after it is first read
    monkeypatch.setattr(commits_ab, "git", lambda *args: "0" * 40 if args[-1] == "BASE" else next(heads))
    checked_out = []
    monkeypatch.setattr(commits_ab, "checkout", lambda rev: checked_out.append(rev) or tmp_path)
    monkeypatch.setattr(commits_ab, "run_side", lambda folder, run_args, out: rows(1.0, 2.0))
    commits_ab.main(["--base", "BASE", "--out", str(tmp_path / "ab.json"), "--runs", str(tmp_path / "runs")])
    result = json.loads((tmp_path / "ab.json").read_text())
    assert checked_out == ["0" * 40, "a" * 40] and (result["base"], result["head"]) == ("0" * 40, "a" * 40)
