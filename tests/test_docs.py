"""Every pointer the docs, the docstrings and the comments of the native sources and scripts give resolves: the files
they name (a path under core/, docs/, …), the `python -m` targets and the dotted modules inside a package
(core.runtime.lean, …). A pointer to what a commit held says so next to it ("at 16ab0bc", "commit 7635cf2").
CHANGELOG.md is a history and is not read."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "drafter", "app", "scripts", "lab", "tests")
FILE = re.compile(r"(?<![\w/.-])((?:core|drafter|app|scripts|lab|tests|docs|weights|data)/[\w/.-]*"
                  r"\.(?:py|cpp|h|sh|md|jinja))")
RUN = re.compile(r"python3? -m ((?:core|drafter|app|scripts|lab|tests)(?:\.\w+)+)")
DOTTED = re.compile(r"(?<![\w/.])((?:core|drafter|app|scripts|lab)\.[a-z_]\w*(?:\.\w+)*)")
AT_COMMIT = re.compile(r"\b(?:at|commit) [0-9a-f]{7,40}\b", re.IGNORECASE)


def texts() -> list[Path]:
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted(ROOT.glob("weights/*.md")), *sorted(ROOT.glob("data/*/*.md"))]
    code = [p for package in PACKAGES for suffix in ("py", "cpp", "h", "sh")
            for p in (ROOT / package).rglob(f"*.{suffix}")]
    return docs + sorted(code) + [ROOT / ".ci" / "run"]


def module_depth(dotted: str) -> int:
    """How many leading parts of a dotted name are a module or package of this repository (the rest: attributes)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        if base.with_suffix(".py").exists() or (base / "__init__.py").exists():
            return n
    return 0


def module_resolves(dotted: str) -> bool:
    """A dotted name whose second part is one of the package's modules or subpackages (core.runtime.…) resolves: as a
    module, an attribute of a module file, or a name its package's __init__ defines. Any other (drafter.reset: a
    variable's attribute) is not a pointer."""
    parts, depth = dotted.split("."), module_depth(dotted)
    if depth < 2:
        return True  # not a pointer into a package (or the package alone)
    if depth == len(parts):
        return True
    base = ROOT.joinpath(*parts[:depth])
    source = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
    # an attribute of a module (a class, a function, a constant), or a name its package's __init__ defines
    return re.search(rf"\b{re.escape(parts[depth])}\b", source.read_text()) is not None


def stale(path: Path) -> list[str]:
    text, found = path.read_text(), []
    for pattern, kind in ((FILE, "file"), (RUN, "run"), (DOTTED, "module")):
        for match in pattern.finditer(text):
            name = match.group(1).rstrip(".")
            if kind == "file":
                ok = (ROOT / name).exists()
            elif kind == "run":
                ok = module_depth(name) == len(name.split("."))
            else:
                ok = module_resolves(name)
            nearby = text[max(0, match.start() - 160): match.end() + 60]
            if not ok and not AT_COMMIT.search(nearby):
                found.append(f"{path.relative_to(ROOT)}: {name}")
    return found


def test_every_pointer_in_the_docs_and_docstrings_resolves():
    wrong = [line for path in texts() for line in stale(path)]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_stale_pointer(tmp_path):
    page = tmp_path / "page.md"
    # the stale names are written apart, so that this file's own text names nothing stale
    gone_file, gone_run, gone_module = "core/runtime/" + "gone.py", "scripts." + "gone", "core.runtime." + "gone"
    page.write_text(f"See core/runtime/lean.py, {gone_file}, `python -m lab.verify_cost`, `python -m {gone_run}`,\n"
                    f"core.runtime.lean.LeanForward and {gone_module}.\n" + "Unrelated text. " * 20 +
                    "\nAt 16ab0bc `python -m " + "scripts.head_ab` ran.\n")
    found = [line.split(": ")[1] for line in stale_at(page)]
    assert found == [gone_file, gone_run, gone_module]


def stale_at(path: Path) -> list[str]:
    """stale() for a file outside the repository (its pointers read against the repository)."""
    text = path.read_text()
    copy = ROOT / "docs" / ".pointer-check.md"
    copy.write_text(text)
    try:
        return stale(copy)
    finally:
        copy.unlink()


def test_no_markdown_file_runs_over_400_lines_but_the_generated_figures_and_the_journals():
    """Design docs explain how and why in a few hundred lines; the history lives in docs/journal/, the numbers on the
    generated figures page."""
    exempt = {ROOT / "docs" / "figures.md", ROOT / "CHANGELOG.md"}
    pages = [p for p in ROOT.rglob("*.md") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]
    long = [str(p.relative_to(ROOT)) for p in pages
            if p not in exempt and "journal" not in p.parts and "results" not in p.parts
            and len(p.read_text().splitlines()) > 400]
    assert long == []
