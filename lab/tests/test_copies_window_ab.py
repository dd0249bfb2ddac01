import pytest

from lab.copies_window_ab import ARMS, BASE, NeverSkip, summary


def test_summary_gives_each_arm_over_plain_and_over_the_16_round_verdict_paired_by_prompt():
    rows = [{"plain": 100.0, "window 64": 110.0, "window 16": 100.0, "never skip": 120.0},
            {"plain": 50.0, "window 64": 66.0, "window 16": 60.0, "never skip": 45.0}]
    out = summary(rows)
    assert out["window 64 / plain"]["mean"] == pytest.approx((1.1 + 1.32) / 2)
    assert out["window 64 / window 16"]["mean"] == pytest.approx(1.1) and out["window 64 / window 16"]["se"] < 1e-9
    assert out["never skip / window 16"]["mean"] == pytest.approx((1.2 + 0.75) / 2)
    assert f"{BASE} / {BASE}" not in out and set(ARMS) == {"window 64", "window 16", "never skip"}


def test_the_never_skip_arm_keeps_drafting_where_the_verdict_would_back_off():
    never, measured = NeverSkip(window=4, max_wait=32, measures=True), ARMS[BASE]()
    measured.max_wait, measured.measures = 32, True
    for verdict in (never, measured):
        for _ in range(8):  # copied rounds at half the plain rate
            verdict.observe(True, 1, 2.0)
            verdict.observe(False, 1, 1.0)
    assert not never.hold() and measured.hold()


def test_run_prompts_starts_every_arm_afresh_every_restart_every_prompts(monkeypatch):
    from core.verification.sampling import SamplingConfig
    from lab import harness

    class Target:
        def chat_ids(self, messages):
            return [1, 2, 3]

    class Runner:
        def generation(self, gen, curve):
            return gen

    class Curves:
        def for_reply(self, context, budget):
            return ()

    seen = []  # per prompt, the state arm "a" ran with
    monkeypatch.setattr(harness.bench, "read_prompts", lambda path, limit: [f"p{i}" for i in range(5)])
    monkeypatch.setattr(harness, "run_arms", lambda target, runner, ids, i, arms, gen_for, states, *rest:
                        seen.append(states["a"]) or {"plain": 1.0, "a": 1.0})
    fields = {"sampling": SamplingConfig(), "max_new_tokens": 8, "prompts": ["x"], "limit": 5,
              "seed": 0}
    harness.run_prompts(fields, Target(), Curves(), Runner(), ["a"], {"a": object()}, restart_every=2,
                                 fresh_states=lambda: {"a": object()})
    assert seen[0] is seen[1] and seen[2] is seen[3]  # prompts 0-1, 2-3 and 4 each share one state
    assert len({id(state) for state in seen}) == 3
