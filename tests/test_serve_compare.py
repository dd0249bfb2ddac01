"""scripts/serve_compare.py: this engine beside vLLM on exported DFlash-format drafters. The vLLM run is slow and
needs the optional vLLM environment (bash scripts/install_vllm.sh; .ci/run installs it)."""
import pytest

from core.decoding.engine import GenerationConfig, generate_all
from drafter.formats.export import export_dflash
from drafter.registry import build_drafter
from drafter.spec import DrafterSpec
from scripts import serve_compare
from tests.test_export import random_zlab_drafter


def test_the_engine_side_counts_tokens_per_round_and_accepts_per_slot(tiny_qwen3_target, tmp_path):
    ckpt = random_zlab_drafter(tiny_qwen3_target, tmp_path / "ckpt")
    drafter = build_drafter(DrafterSpec("dflash", weights=str(export_dflash(ckpt, tmp_path / "x"))), tiny_qwen3_target)
    prompts = [[5, 6, 7], [9, 10, 11, 12]]
    got = serve_compare.engine_run(tiny_qwen3_target, prompts, 12, drafter)
    rounds = [ev for ids in prompts for ev in generate_all(tiny_qwen3_target, ids, GenerationConfig(12), drafter)[1]
              if ev.kind == "round" and ev.drafted]
    assert got["drafted_rounds"] == len(rounds)
    assert got["acceptance_length"] == pytest.approx(1 + sum(ev.n_accepted for ev in rounds) / len(rounds))
    assert got["accepted_per_position"][0] == sum(ev.n_accepted >= 1 for ev in rounds)
    plain = serve_compare.engine_run(tiny_qwen3_target, prompts, 12)
    assert plain["outputs"] == got["outputs"] and plain["acceptance_length"] is None


def test_without_the_vllm_environment_it_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(serve_compare, "VLLM_READY", tmp_path / "none" / ".installed")
    with pytest.raises(SystemExit, match="install_vllm.sh"):
        serve_compare.vllm_runs(tmp_path, [], [[1, 2]], 4)


def test_a_folder_that_is_not_an_export_is_refused_before_vllm_starts(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a DFlash-format folder"):
        serve_compare.compare([str(tmp_path)], limit=1, max_tokens=4, target_dir=tmp_path / "t")


@pytest.mark.slow
@pytest.mark.skipif(not serve_compare.VLLM_READY.exists(), reason="vLLM (optional) not installed")
def test_vllm_serves_an_exported_drafter_exactly_on_21_eval_prompts(embedded_target, tmp_path):
    """T = 0 through vLLM with the drafter equals vLLM's plain decoding on every prompt; this engine agrees with
    both; vLLM's acceptance length (its own counters) matches this engine's on the same drafter and prompts."""
    ckpt = random_zlab_drafter(embedded_target, tmp_path / "ckpt", layers=1, block=15)
    folder = str(export_dflash(ckpt, tmp_path / "export", dtype="float32"))
    result = serve_compare.compare([folder], limit=7, max_tokens=24, target_dir=tmp_path / "target")
    assert result["prompts"] == 21
    row = result["drafters"][folder]
    assert row["vllm_identical_to_vllm_plain"] == row["engine_identical_to_engine_plain"] == 21
    assert result["engines_agree_plain"] >= 19  # two fp32 engines, other kernels: a rare near-tie may fork
    assert row["vllm_drafts"] > 0 and row["vllm_acceptance_length"] == pytest.approx(
        row["engine_acceptance_length"], abs=0.1)
