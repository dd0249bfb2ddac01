import json
from pathlib import Path

from lab.gpu_report import compiled_table, derived_speedup, expected_tokens, oracle_table

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "gpu" / "arch-2026-12-04.json"


def test_expected_tokens_and_the_derived_speedup_at_the_extremes():
    assert expected_tokens(1.0, 8) == 9 and abs(expected_tokens(0.0, 8) - 1.0) < 1e-12
    flat = {str(t): 1.0 for t in range(1, 18)}  # a verify that costs what one position costs
    assert derived_speedup(1.0, 16, flat, 0.0) == 17 and derived_speedup(0.0, 16, flat, 1.0) == 0.5


def test_the_recorded_run_prints_its_oracle_beside_the_derivation_and_its_compiled_forwards():
    results = json.loads(RESULTS.read_text())
    bf16 = results["qwen3_bf16"]
    table = oracle_table(bf16["oracle"], bf16["verify_cost"]["256"]["relative_to_one"], 0.0)
    assert table.count("\n") == 1 + len(bf16["oracle"]) and "| 16 | 0.8 | 6.05 | 2.57x | 4.21x / 4.21x |" in table
    compiled = compiled_table(results["compiled_step"])
    assert "| graphs | 113.4 | 39% | 256 | 1.00 | 1.08 |" in compiled and "floor: 293 tokens/s" in compiled
