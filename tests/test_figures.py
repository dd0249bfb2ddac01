"""The figures page and the README's figures: generated from docs/results/ by scripts.figures, each with its machine,
date and command, the README's CPU figures from one machine, and a changed result seen as stale."""
import json
import re
import shutil
from pathlib import Path

from scripts import figures

ROOT = Path(__file__).resolve().parent.parent


def manifest() -> dict:
    return json.loads((ROOT / figures.MANIFEST).read_text())


def test_the_page_and_the_readme_blocks_are_current():
    assert figures.stale() == [], "run python -m scripts.figures"


def test_every_figure_names_its_machine_date_and_command_and_the_readmes_cpu_figures_share_one_machine():
    data = manifest()
    for fig in data["figures"]:
        assert fig["machine"] in data["machines"] and re.fullmatch(r"\d{4}-\d\d-\d\d", fig["date"]), fig["id"]
        assert fig["command"].startswith(("python", "bash")), fig["id"]
    in_readme = {fig["machine"] for fig in data["figures"] if fig.get("readme")}
    assert len(in_readme) == 1 and "GPU" not in data["machines"][in_readme.pop()]
    readme = (ROOT / "README.md").read_text()
    assert all(f"<!-- figures:{fig['id']} -->" in readme for fig in data["figures"] if fig.get("readme"))


def test_a_changed_result_leaves_the_page_and_the_readme_stale(tmp_path):
    data = manifest()
    names = {fig["results"] for fig in data["figures"] if "results" in fig}
    names |= {spec.partition(":")[0] for fig in data["figures"] for row in fig.get("rows", ())
              for spec in (row["value"], row.get("over", row["value"]), row.get("se", row["value"]))}
    for name in names:
        source, copy = ROOT / "docs" / "results" / name, tmp_path / "docs" / "results" / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, copy, dirs_exist_ok=True)
        else:
            shutil.copy(source, copy)
    for name in ("README.md", "docs/figures.md", str(figures.MANIFEST)):
        shutil.copy(ROOT / name, tmp_path / name)
    assert figures.stale(tmp_path) == []
    heldout = next(fig for fig in data["figures"] if fig["id"] == "heldout")
    run = tmp_path / "docs" / "results" / heldout["results"] / "auto-math-t0.json"
    result = json.loads(run.read_text())
    result["tokens_per_s"] *= 1.5
    run.write_text(json.dumps(result))
    assert figures.stale(tmp_path) == ["docs/figures.md", "README.md"]
