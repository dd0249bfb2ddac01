"""app/service.py: one route from the app's settings to the engine's GenerationConfig, taken alike by the UI, the
OpenAI-compatible API and the bench."""
import argparse

import pytest

from app import bench, ui
from app.openai_api import ChatRequest, settings_for
from app.service import ChatSettings, engine_settings
from core.decoding.engine import GenerationConfig
from core.drafting.policy.config import DEFAULTS
from drafter.spec import CHOICES, RunSpec, SpecError

CURVE = (1.0, 1.1, 1.3, 1.6)


@pytest.mark.parametrize("choice", CHOICES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ui_api_and_bench_build_the_same_generation_config(choice, temperature):
    from_ui = ui.settings_from(drafter=choice, block_size=4, temperature=temperature, max_new_tokens=64)
    from_api = settings_for(ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], drafter=choice,
                                        block_size=4, temperature=temperature, max_tokens=64), "auto")
    parser = argparse.ArgumentParser()
    bench.add_spec_args(parser)
    args = parser.parse_args(["--block-size", "4"])
    spec = bench.choice_from_args(choice, args)
    drafting = choice != "none"
    runner = bench.Runner(spec, 4, run=lambda ids, gen: None, drafter=object() if drafting else None)
    from_bench = runner.generation(GenerationConfig(64, sampling=from_ui.sampling(), seed=0), CURVE)
    assert from_ui == from_api and from_ui.spec() == spec
    assert from_ui.generation(CURVE, drafting) == from_bench
    adaptive = choice in ("auto", "copies")
    assert from_bench.verify_cost == (CURVE if adaptive else ()) and from_bench.block_size == 4
    assert from_bench.policy.plain_probe_every == (DEFAULTS.app_probe_every if drafting else 0)
    assert from_bench.policy.max_skip == (DEFAULTS.max_skip if adaptive else 0)


def test_the_drafters_call_cost_is_charged_only_where_the_spec_is_adaptive():
    auto, flashmap = ChatSettings().spec(), ChatSettings(drafter="flashmap").spec()
    assert engine_settings(auto, GenerationConfig(8), CURVE, True, 0.6).draft_cost == 0.6
    assert engine_settings(flashmap, GenerationConfig(8), CURVE, True, 0.6).draft_cost == 0.0


def test_the_cuts_bound_goes_from_the_bench_flag_through_the_spec_to_the_policy():
    parser = argparse.ArgumentParser()
    bench.add_spec_args(parser)
    args = parser.parse_args(["--adaptive", "--max-skip", "0", "--max-lost", "0.02"])
    spec = bench.spec_from_args("flashmap", args)
    assert spec.max_lost == 0.02 and spec.text() == "flashmap,adaptive=1,skip=0,lost=0.02"
    assert RunSpec.parse(spec.text()) == spec and "at most 0.02 expected tokens a round cut" in spec.describe()
    assert engine_settings(spec, GenerationConfig(8), CURVE).policy.max_lost == 0.02
    with pytest.raises(SpecError, match="needs adaptive=1"):
        RunSpec.parse("flashmap,lost=0.02")
    with pytest.raises(SpecError, match="lost must be in"):
        RunSpec.parse("flashmap,adaptive=1,lost=-1")
    args = parser.parse_args(["--max-lost", "0.05"])
    assert bench.choice_from_args("auto", args).max_lost == 0.05
    with pytest.raises(SystemExit, match="needs adaptive=1"):
        bench.choice_from_args("flashmap", args)  # the networks' choices draft every round, uncut
