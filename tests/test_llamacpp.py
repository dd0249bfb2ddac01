"""The bench's llama.cpp anchor (app/llamacpp.py): clear refusals, and one real run where llama-cpp-python is
installed (an optional extra: bash scripts/install_llamacpp.sh)."""
import importlib.util
import json

import pytest

from app import bench
from app.llamacpp import LlamaCpp, LlamaCppRun, LlamaCppUnavailable, summary
from core.testing import make_target, tiny_llama


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


def test_summary_puts_llama_cpp_beside_both_engine_speeds():
    runs = [LlamaCppRun(10, 0.1, " a b"), LlamaCppRun(30, 0.3, "c")]
    result = summary(runs, ["a b", "d"], plain_tps=50.0, drafter_tps=150.0)
    assert result["tokens_per_s"] == pytest.approx(100.0)
    assert result["texts_identical_to_plain"] == 1 and result["prompts"] == 2
    assert result["plain_vs_llama_cpp"] == pytest.approx(0.5) and result["drafter_vs_llama_cpp"] == pytest.approx(1.5)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python (optional) not installed")
def test_bench_runs_llama_cpp_on_the_embedded_gguf(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 7 times 8?"}) + "\n")
    out = tmp_path / "r.json"
    bench.main(["--prompts", str(prompts), "--drafter", "ngram", "--max-new-tokens", "16", "--vs", "llama.cpp",
                "--out", str(out)])
    anchor = json.loads(out.read_text())["llama_cpp"]
    assert anchor["prompts"] == 1 and anchor["tokens_per_s"] > 0 and anchor["plain_vs_llama_cpp"] > 0
