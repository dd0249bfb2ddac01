"""The bench's llama.cpp anchor (app/llamacpp.py): clear refusals, and one real run where llama-cpp-python is
installed (an optional extra: bash scripts/install_llamacpp.sh)."""
import importlib.util
import json

import pytest

from app import bench
from app.llamacpp import NATIVE_BENCH, LlamaCpp, LlamaCppRun, LlamaCppUnavailable, NativeLlamaCpp, summary
from lab.testing import make_target, tiny_llama


def test_a_target_without_a_gguf_file_is_refused_with_the_reason():
    with pytest.raises(LlamaCppUnavailable, match="GGUF"):
        LlamaCpp(make_target(tiny_llama()))


def test_a_missing_llama_cpp_says_how_to_install_it(monkeypatch):
    target = make_target(tiny_llama())
    target.name = "smollm2-135m-instruct"
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real_find(name, *a))
    with pytest.raises(LlamaCppUnavailable, match="install_llamacpp.sh"):
        LlamaCpp(target)


def test_summary_puts_the_native_binary_beside_both_engine_speeds_and_llama_cpp_python_beside_it():
    runs = [LlamaCppRun(10, 0.2, " a b"), LlamaCppRun(30, 0.6, "c")]
    result = summary([0.1, 0.3], [10, 30], runs, ["a b", "d"], plain_tps=50.0, drafter_tps=150.0)
    assert result["tokens_per_s"] == pytest.approx(100.0) and result["binary"] == "llama-bench"
    assert result["prompts"] == 2
    assert result["plain_vs_llama_cpp"] == pytest.approx(0.5) and result["drafter_vs_llama_cpp"] == pytest.approx(1.5)
    python = result["llama_cpp_python"]
    assert python["tokens_per_s"] == pytest.approx(50.0) and python["of_native"] == pytest.approx(0.5)
    assert python["texts_identical_to_plain"] == 1
    assert "llama_cpp_python" not in summary([0.1], [10], None, ["a"], 50.0, 150.0)


def test_a_missing_native_binary_says_how_to_build_it(tmp_path):
    target = make_target(tiny_llama())
    target.name = "smollm2-135m-instruct"
    with pytest.raises(LlamaCppUnavailable, match="install_llamacpp.sh"):
        NativeLlamaCpp(target, binary=tmp_path / "llama-bench")


@pytest.mark.skipif(not NATIVE_BENCH.is_file(), reason="llama.cpp's own llama-bench (optional) not built")
def test_the_native_binary_times_a_prompt_and_a_reply():
    from core.runtime.target import TargetConfig, load_target

    native = NativeLlamaCpp(load_target(TargetConfig(quant="q4")), threads=1)
    assert 0 < native.seconds(8, 4) < 60 and 0 < native.seconds(4, 4, depth=8) < 60


@pytest.mark.slow
@pytest.mark.skipif(not NATIVE_BENCH.is_file(), reason="llama.cpp's own llama-bench (optional) not built")
def test_bench_runs_llama_cpp_on_the_embedded_gguf(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 7 times 8?"}) + "\n")
    out = tmp_path / "r.json"
    bench.main(["--prompts", str(prompts), "--drafter", "ngram", "--max-new-tokens", "16", "--vs", "llama.cpp",
                "--out", str(out)])
    anchor = json.loads(out.read_text())["llama_cpp"]
    assert anchor["prompts"] == 1 and anchor["tokens_per_s"] > 0 and anchor["plain_vs_llama_cpp"] > 0
    if importlib.util.find_spec("llama_cpp") is not None:  # llama-cpp-python's figure beside the native one
        assert anchor["llama_cpp_python"]["tokens_per_s"] > 0 and anchor["per_prompt"][0]["python_tokens"] > 0
