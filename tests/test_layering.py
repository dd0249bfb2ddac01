"""The packages depend one way: core <- drafter <- app <- scripts (what a user runs) <- lab (experiments, which the
product never imports). Read from the source, so a new import that runs back up (or a lazy one inside a function)
fails here."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"core": set(), "drafter": {"core"}, "app": {"core", "drafter"}, "scripts": {"core", "drafter", "app"},
          "lab": {"core", "drafter", "app", "scripts"}}  # package -> what it may import


def imported_packages(path: Path) -> set[str]:
    """Top-level project packages a module imports, at any depth of its code (lazy imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & {"core", "drafter", "app", "scripts", "lab", "tests"}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_imports_run_one_way(package):
    for path in sorted((ROOT / package).rglob("*.py")):
        if "tests" in path.relative_to(ROOT / package).parts:
            continue  # the lab's own tests, which read the project's test fixtures
        wrong = imported_packages(path) - LAYERS[package] - {package}
        where = path.relative_to(ROOT)
        assert not wrong, f"{where} imports {sorted(wrong)}: {package} may import only {LAYERS[package]}"


def module_name(path: Path) -> str:
    """core/drafting/policy/offers.py -> core.drafting.policy.offers; a package's __init__.py -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (its own level-0 imports; `from a.b import c` counts as
    a.b.c where that is a module, else a.b), subpackages included."""
    paths = sorted((ROOT / package).rglob("*.py"))
    known = {module_name(path) for path in paths}
    graph = {}
    for path in paths:
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == package:
                for alias in node.names:
                    deps.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module)
        graph[module_name(path)] = deps - {module_name(path)}
    return graph


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_import_loop_inside_a_package(package):
    graph = module_graph(package)

    def visit(node, trail):
        assert node not in trail, f"import loop in {package}: {' -> '.join(trail + [node])}"
        for dep in graph.get(node, ()):
            visit(dep, trail + [node])

    for module in graph:
        visit(module, [])


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from app.service import ChatService\n")
    assert imported_packages(bad) == {"app"}


def test_the_readme_drawing_is_current():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "structure.py"), "--check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


# core's floors, lowest first: each imports only from itself and the floors below it; its top-level module, prompts,
# sits above them all
CORE_ORDER = ("runtime", "verification", "drafting", "decoding", "prompts")


# drafter's floors, lowest first (a subpackage or a top-level module each): each imports only from itself and below
DRAFTER_ORDER = ("config", "flow", "spec", "networks", "formats", "runtime", "blocks", "data", "evaluation", "training",
                 "registry")


def floor_violations(package: Path, order: tuple[str, ...]) -> list[str]:
    """Every import in `package` (a folder laid out as core/ or drafter/) of a floor of `order` (a subpackage or a
    top-level module each) above the importing module's own, lazy imports included: "core/runtime/lean.py imports
    core.decoding.engine"."""
    name, wrong = package.name, []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts == ("__init__",):
            continue
        floor = order.index(parts[0])
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            if isinstance(node, ast.ImportFrom) and node.module == name:  # from drafter import data
                names = [f"{name}.{alias.name}" for alias in node.names]
            for imported in names:
                target = imported.split(".")
                if target[0] == name and len(target) > 1 and order.index(target[1]) > floor:
                    wrong.append(f"{name}/{path.relative_to(package)} imports {imported}")
    return wrong


def floors(package: Path) -> set[str]:
    """A package's subpackages and top-level modules."""
    return {p.stem if p.suffix == ".py" else p.name for p in package.iterdir()
            if p.suffix == ".py" and p.stem != "__init__" or (p / "__init__.py").exists()}


def test_drafters_floors_import_only_downward():
    assert floors(ROOT / "drafter") == set(DRAFTER_ORDER)
    assert floor_violations(ROOT / "drafter", DRAFTER_ORDER) == []


def test_an_upward_import_in_the_drafter_package_is_refused(tmp_path):
    import shutil

    copy = tmp_path / "drafter"
    shutil.copytree(ROOT / "drafter", copy, ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    rotary = copy / "networks" / "rotary.py"
    rotary.write_text(rotary.read_text() + "\n\ndef late():\n    from drafter.runtime.release import ReleaseDrafter\n")
    assert floor_violations(copy, DRAFTER_ORDER) == [
        "drafter/networks/rotary.py imports drafter.runtime.release"]


def test_cores_floors_import_only_downward():
    assert floors(ROOT / "core") == set(CORE_ORDER)
    assert floor_violations(ROOT / "core", CORE_ORDER) == []


def test_an_upward_import_in_core_is_refused(tmp_path):
    import shutil

    copy = tmp_path / "core"
    shutil.copytree(ROOT / "core", copy, ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    assert floor_violations(copy, CORE_ORDER) == []
    lean = copy / "runtime" / "lean.py"
    lean.write_text(lean.read_text() + "\n\ndef late():\n    from core.decoding.engine import generate\n")
    (copy / "drafting" / "base.py").write_text((copy / "drafting" / "base.py").read_text() + "\nimport core.prompts\n")
    assert floor_violations(copy, CORE_ORDER) == ["core/drafting/base.py imports core.prompts",
                                                  "core/runtime/lean.py imports core.decoding.engine"]
