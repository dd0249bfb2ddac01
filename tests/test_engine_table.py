"""scripts.engine_table: the app's default per prompt set, domain and temperature, from bench summaries."""
import json

from scripts import engine_table


def summary(speedup: float, identical: bool = True, temperature: float = 0.0) -> dict:
    return {"speedup": speedup, "speedup_se": 0.031, "acceptance_length": 1.456, "temperature": temperature,
            "identical_to_baseline": identical,
            "rounds_by_source": {"lookup": 1000, "phrasebook": 500, "lookup try": 7, "drafter": 12, "plain": 90}}


def test_a_cell_counts_copied_drafted_and_plain_rounds(tmp_path):
    path = tmp_path / "eval-math-t0.json"
    path.write_text(json.dumps(summary(1.234)))
    assert engine_table.cell(path) == "**1.23× ± 0.03** (τ 1.46; 1,507 / 12 / 90)"
    path.write_text(json.dumps(summary(1.05, identical=False)))
    assert engine_table.cell(path).endswith("90, NOT identical)")  # a T = 0 reply that differed is said
    path.write_text(json.dumps(summary(0.97, identical=False, temperature=1.0)))
    assert engine_table.cell(path) == "0.97× ± 0.03 (τ 1.46; 1,507 / 12 / 90)"  # at T > 0 replies differ by design


def test_the_table_has_a_row_per_set_and_temperature_found(tmp_path):
    (tmp_path / "eval-code-t0.json").write_text(json.dumps(summary(1.4)))
    (tmp_path / "fresh-chat-t1.json").write_text(json.dumps(summary(0.99, temperature=1.0)))
    lines = engine_table.cells_table(tmp_path)
    assert lines[2].startswith("| eval, 0 | — | **1.40×") and lines[3].startswith("| fresh, 1 | — | — | 0.99×")
    assert len(lines) == 4  # no row for a set and temperature without files


def test_a_cell_comes_from_the_first_folder_that_holds_it(tmp_path):
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir(), old.mkdir()
    (new / "eval-math-t0.json").write_text(json.dumps(summary(1.3)))
    (old / "eval-math-t0.json").write_text(json.dumps(summary(1.1)))
    (old / "eval-math-t1.json").write_text(json.dumps(summary(1.05, temperature=1.0)))
    lines = engine_table.cells_table(new, old)
    assert lines[2].startswith("| eval, 0 | **1.30×") and lines[3].startswith("| eval, 1 | 1.05×")
