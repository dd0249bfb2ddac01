"""Draw the project's structure from its imports: the README's layout drawing (a mermaid flowchart).

python -m scripts.structure            prints it
python -m scripts.structure --check    exits 1 if README.md does not hold the current drawing
python -m scripts.structure --write    puts the current drawing between README.md's markers

Three layers, top to bottom: app (product), drafter (the drafters), core (target, engine, verification);
an arrow says how many module imports go from one layer to another; every arrow points down.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "drafter", "core")  # top to bottom
BEGIN, END = "<!-- structure:begin -->", "<!-- structure:end -->"


def project_imports(path: Path) -> set[str]:
    """'package.module' names a file imports from the three packages (lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] in PACKAGES:
                found |= {node.module} if len(parts) > 1 else {f"{parts[0]}.{a.name}" for a in node.names}
    return found


def modules() -> dict[str, set[str]]:
    """'package.module' (a subpackage's modules as 'package.group.module') -> what it imports."""
    graph = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.stem != "__init__":
                name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                graph[name] = project_imports(path)
    graph["app.py"] = project_imports(ROOT / "app.py")
    return graph


def nested(names: list[str]) -> list[str]:
    """A group's modules, a package inside it as 'package/(a · b)'."""
    out, inner = [], {}
    for name in names:
        head, _, rest = name.partition(".")
        if rest:
            inner.setdefault(head, []).append(rest)
        else:
            out.append(name)
    return out + [f"{head}/({' · '.join(rest)})" for head, rest in inner.items()]


def listing(graph: dict[str, set[str]], package: str) -> list[str]:
    """A package's modules for its box: the top-level ones on one line, then one line per subpackage (its job)."""
    top, groups = [], {}
    for name in graph:
        parts = name.split(".")
        if parts[0] != package or name == "app.py":
            continue
        if len(parts) == 2:
            top.append(parts[1])
        else:
            groups.setdefault(parts[1], []).append(".".join(parts[2:]))
    lines = [f"<i>{group}/</i> {' · '.join(nested(names))}" for group, names in groups.items()]
    return ([" · ".join(top)] if top else []) + lines


def drawing() -> str:
    """A box per package listing its modules; one arrow per pair of layers, labelled with how many module
    imports cross it (imports within a package are left out: they are many and say nothing about layering)."""
    graph = modules()
    crossings: dict[tuple[str, str], int] = {}
    for src, deps in graph.items():
        src_pkg = "app.py" if src == "app.py" else src.split(".")[0]
        for dep in deps:
            if dep.split(".")[0] != src_pkg:
                key = (src_pkg, dep.split(".")[0])
                crossings[key] = crossings.get(key, 0) + 1
    lines = ["```mermaid", "flowchart TB", "  app.py([app.py])"]
    for package in PACKAGES:
        lines.append(f"  {package}[\"<b>{package}/</b><br>{'<br>'.join(listing(graph, package))}\"]")
    for (src, dst), n in sorted(crossings.items(), key=lambda kv: (kv[0][0] != "app.py", kv[0])):
        lines.append(f"  {src} -->|{n}| {dst}")
    lines.append("```")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare with the drawing in README.md")
    mode.add_argument("--write", action="store_true", help="put the current drawing between README.md's markers")
    args = parser.parse_args(argv)
    if not args.check and not args.write:
        print(drawing())
        return
    path = ROOT / "README.md"
    readme = path.read_text()
    if BEGIN not in readme or END not in readme:
        sys.exit(f"README.md has no {BEGIN} ... {END} markers")
    head, rest = readme.split(BEGIN, 1)
    current, tail = rest.split(END, 1)
    if args.write:
        path.write_text(f"{head}{BEGIN}\n{drawing()}\n{END}{tail}")
    elif current.strip() != drawing():
        sys.exit("README.md's structure drawing is stale: python -m scripts.structure --write")


if __name__ == "__main__":
    main()
