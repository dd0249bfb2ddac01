import pytest

from lab.harness import rounded
from lab.suite_pairs import pairs


def variant(name: str, seconds: list[float]) -> dict:
    return {"variant": name, "speedup": 1.123456, "speedup_se": 0.01, "acceptance_length": 1.5,
            "rounds_by_source": {"plain": 3}, "identical_to_baseline": True,
            "round_costs": [{"source": "plain", "plain_rounds": 1.0}],
            "per_prompt": [{"tokens": 100, "s": s} for s in seconds]}


def test_later_variants_are_paired_with_the_first_prompt_by_prompt():
    suite = {"prompts_files": ["eval_chat"], "limit": 2, "temperature": 0.0,
             "results": [variant("a", [1.0, 2.0]), variant("b", [0.5, 2.0])]}
    out = pairs(suite)
    assert out["paired"]["b / a"]["mean"] == pytest.approx(1.5) and out["paired"]["b / a"]["se"] == pytest.approx(0.5)
    assert out["tokens_per_s"] == {"a": [100.0, 50.0], "b": [200.0, 50.0]}
    assert out["variants"][0]["speedup"] == 1.123 and "per_prompt" not in out["variants"][0]
    suite["results"][1]["round_costs"] = [{"source": "lookup"}, {"source": "lookup try"}]
    assert pairs(suite, ("try",))["variants"][1]["round_costs"] == [{"source": "lookup try"}]


def test_rounding_keeps_significant_digits_inside_lists_and_dicts():
    assert rounded({"x": [1.23456789, {"y": 0.000123456}], "n": 3, "s": "a"}) == \
        {"x": [1.235, {"y": 0.0001235}], "n": 3, "s": "a"}
