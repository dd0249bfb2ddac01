import json

import pytest

from core.runtime.verify_cost import CostCurves, cache_file, curve_passes, fitting_contexts, load_cached, save_cached
from lab.testing import make_target, tiny_llama

# seconds of 1, 2, 3 positions after 100 and after 500 cached: the extra rows cost more after the longer context
CURVES = CostCurves((100, 500), ((1.0, 1.2, 1.4), (2.0, 3.0, 4.0)))


@pytest.fixture(scope="module")
def target():
    return make_target(tiny_llama(vocab_size=64), name="tiny-cost")


def test_a_curve_between_two_contexts_is_their_seconds_interpolated():
    assert CURVES.at(100) == (1.0, 1.2, 1.4)
    assert CURVES.at(500) == (1.0, 1.5, 2.0)
    assert CURVES.at(300) == pytest.approx((1.0, 2.1 / 1.5, 2.7 / 1.5))  # seconds (1.5, 2.1, 2.7) halfway


def test_below_the_first_context_its_curve_holds_and_beyond_the_last_the_trend_goes_on():
    assert CURVES.at(0) == CURVES.at(100) == (1.0, 1.2, 1.4)
    assert CURVES.at(900) == pytest.approx((1.0, 4.8 / 3.0, 6.6 / 3.0))  # seconds (3.0, 4.8, 6.6) one step further
    assert CURVES.at(10**6)[2] <= 3.0  # made sane: n positions never cost more than n


def test_a_reply_reads_the_curve_after_its_prompt_and_half_its_budget():
    assert CURVES.for_reply(200, 200) == CURVES.at(300)
    one = CostCurves((256,), ((2.0, 2.5),))
    assert one.at(0) == one.at(5000) == one.for_reply(10, 10) == (1.0, 1.25)


@pytest.mark.parametrize("contexts, seconds", [((), ()), ((500, 100), ((1.0,), (1.0,))), ((100,), ((1.0,), (1.0,))),
                                               ((100, 500), ((1.0, 2.0), (1.0,))), ((100,), ((0.0, 1.0),))])
def test_malformed_curves_are_refused(contexts, seconds):
    with pytest.raises(ValueError):
        CostCurves(contexts, seconds)


def test_contexts_are_cut_to_what_the_context_window_holds(target):
    assert target.max_positions == 512
    assert fitting_contexts(target, (256, 1024)) == (256,)  # 1,024 + 17 positions do not fit in 512
    assert fitting_contexts(target, (1024, 2048)) == (494,)  # none fits: the first, cut down to the room left
    assert fitting_contexts(target, (16, 64), max_positions=4) == (16, 64)


def test_curves_are_measured_after_each_context_pass_by_pass(target):
    passes = list(curve_passes(target, repeats=2, contexts=(16, 64), max_positions=4))
    assert len(passes) == 2
    curves = passes[-1]
    assert curves.contexts == (16, 64) and all(len(row) == 4 for row in curves.seconds)
    assert all(curve[0] == 1.0 and all(1.0 <= c <= n for n, c in enumerate(curve, start=1))
               for curve in (curves.at(16), curves.at(40), curves.at(64)))


def test_cached_curves_round_trip_and_an_older_single_curve_file_is_measured_again(tmp_path, target):
    save_cached(tmp_path, target, CURVES)
    curves, measured_at = load_cached(tmp_path, target)
    assert curves == CURVES and measured_at > 0
    path = cache_file(tmp_path, target)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({"key": data["key"], "curve": [1.0, 1.2], "measured_at": 1.0}))
    assert load_cached(tmp_path, target) is None


def test_interleaved_passes_open_each_round_one_key_later_and_report_every_key():
    from core.runtime.verify_cost import interleaved

    opened = []

    def passes(key):
        times = {1: []}
        while True:
            opened.append(key)
            times[1].append(float(len(opened)))
            yield times

    medians = list(interleaved({key: passes(key) for key in "abc"}, 4))
    assert opened == list("abc" "bca" "cab" "abc")
    assert [list(m) for m in medians] == [list("abc")] * 4  # each round's medians keyed in the callers' order
    assert medians[-1]["a"] == {1: 7.0}  # a opened the 1st, 6th, 8th and 10th pass: the median of all of them


def test_on_fixed_shape_steps_every_timed_pass_runs_the_steps_after_its_own_context(monkeypatch):
    """The fixed-shape steps hand out one persistent cache: the passes after 256 and 1,024 positions share it, each
    at its own context, and every timed forward is a step over that cache (none falls back to the eager forward)."""
    from core.runtime.graphs import GraphedSteps
    from core.runtime.lean import LeanForward
    from core.runtime.verify_cost import curve_passes
    from lab.testing import QWEN3_TEMPLATE, make_target, tiny_qwen3

    model = tiny_qwen3(vocab_size=64)
    model.config.max_position_embeddings = 4096
    target = make_target(model, template=QWEN3_TEMPLATE)
    steps = target.lean = GraphedSteps(LeanForward(model), "sim", min_span=16)
    seen = []
    call = GraphedSteps.__call__

    def recorded(self, ids, cache, *args, **kwargs):
        if len(ids) <= 17:  # a timed forward, not a context's prefill
            seen.append((cache is self.cache, cache.length))
        return call(self, ids, cache, *args, **kwargs)

    monkeypatch.setattr(GraphedSteps, "__call__", recorded)
    for curves in curve_passes(target, 2, contexts=(256, 1024), max_positions=4):
        pass
    assert seen and all(on_steps for on_steps, _ in seen) and steps.cache is not None
    assert {length for _, length in seen} == {256, 1024}
    assert curves.contexts == (256, 1024)


def test_a_curve_extrapolated_past_the_last_context_never_goes_below_what_was_measured():
    from core.runtime.verify_cost import CostCurves

    curves = CostCurves((256, 1024), ((1.0, 2.0, 3.0), (0.9, 1.8, 2.0)))  # longer context measured cheaper (noise)
    far = curves.at(100_000)
    assert all(1.0 <= cost <= n for n, cost in enumerate(far, start=1))
    assert far == tuple(s / 0.9 for s in (0.9, 1.8, 2.0))  # held at the smaller of the two, not extrapolated down
