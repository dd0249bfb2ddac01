"""Regenerate docs/figures.md, the project's current figures, and the README's blocks drawn from it.

python -m scripts.figures [--check]

Which runs are current, and on which machine, date and command each was measured, is docs/results/figures.json (the
manifest); every number on the page is read from the result files it names, none typed in. A README block
`<!-- figures:ID -->` … `<!-- /figures:ID -->` holds figure ID as the README shows it. --check exits 1 naming what
is stale instead of writing. Other docs state rules and point here for numbers; docs/benchmarks.md (scripts/report.py)
keeps the drafters' research figures.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = Path("docs/results/figures.json")
PAGE = Path("docs/figures.md")
README = Path("README.md")
DOMAINS = ("math", "code", "chat")
BLOCK = re.compile(r"(<!-- figures:([\w-]+) -->\n)(.*?)(<!-- /figures:\2 -->)", re.S)


def read(root: Path, path: str) -> dict:
    return json.loads((root / "docs" / "results" / path).read_text())


def where(fig: dict, machines: dict) -> str:
    """The line every figure carries: machine, date, version, command and results."""
    parts = [f"**{machines[fig['machine']]}**", fig["date"]]
    if "version" in fig:
        parts.append(f"version {fig['version']}")
    text = ", ".join(parts) + f": `{fig['command']}`"
    return text + (f" (results: `docs/results/{fig['results']}`)" if "results" in fig else "")


def bench_domains(fig: dict, root: Path) -> list[str]:
    """The held-out speed table: llama.cpp's binary, llama-cpp-python, plain decoding, Auto and Copies."""
    runs = {(f"{choice}-t{t}", domain): read(root, f"{fig['results']}/{choice}-{domain}-t{t}.json")
            for choice, t in (("auto", 0), ("auto", 1), ("copies", 0)) for domain in DOMAINS}

    def cells(fn) -> str:
        return " | ".join(fn(domain) for domain in DOMAINS)

    def of_plain(name: str, domain: str) -> str:
        run = runs[(name, domain)]
        return f"{run['speedup']:.2f}× ± {run['speedup_se']:.2f}"

    def sources(domain: str) -> str:
        by = runs[("auto-t0", domain)]["tokens_by_source"]
        total = sum(by.values())
        keys = ("drafter", "lookup", "phrasebook", "target")
        return " / ".join(f"{100 * by.get(key, 0) / total:.2g}%" for key in keys)

    auto = lambda d: runs[("auto-t0", d)]  # noqa: E731
    llama = lambda d: auto(d)["llama_cpp"]  # noqa: E731
    return [
        "| | math | code | chat |", "| --- | --- | --- | --- |",
        "| llama.cpp's own binary (`llama-bench`), same GGUF, 2 threads (tok/s) | "
        + cells(lambda d: f"{llama(d)['tokens_per_s']:.0f}") + " |",
        "| llama-cpp-python on the same llama.cpp (tok/s; of the binary) | " + cells(
            lambda d: f"{llama(d)['llama_cpp_python']['tokens_per_s']:.0f} "
                      f"({llama(d)['llama_cpp_python']['of_native']:.2f})") + " |",
        "| **this app, plain decoding** (tok/s; of llama.cpp) | " + cells(
            lambda d: f"{auto(d)['baseline_tokens_per_s']:.0f} ({llama(d)['plain_vs_llama_cpp']:.2f})") + " |",
        "| **Auto**, T = 0 (tok/s; of llama.cpp), of plain | " + cells(
            lambda d: f"**{auto(d)['tokens_per_s']:.0f} ({llama(d)['drafter_vs_llama_cpp']:.2f})**, "
                      + of_plain("auto-t0", d)) + " |",
        "| Copies, T = 0, of plain | " + cells(lambda d: of_plain("copies-t0", d)) + " |",
        "| **Auto**, T = 1, of plain | " + cells(lambda d: of_plain("auto-t1", d)) + " |",
        "| Auto's tokens at T = 0: network / prompt lookup / phrasebook / the target's own | " + cells(sources) + " |",
        "",
        "Every T = 0 reply identical to plain decoding: "
        + ("yes" if all(runs[(n, d)]["identical_to_baseline"] for n in ("auto-t0", "copies-t0") for d in DOMAINS)
           else "**no**") + "; ± is the jackknife standard error over the prompts.",
    ]


def fresh_clone(fig: dict, root: Path) -> list[str]:
    run = read(root, fig["results"])
    lines = [f"- `bash scripts/setup.sh` on a fresh clone of {run['commit'][:7]} (packages from pip's cache): "
             f"{run['setup_s']:.0f} s",
             f"- first start, `python app.py` until the page answers, nothing of the app cached (it compiles the "
             f"native extensions for this CPU and checks the forward's exactness): **{run['first_start_s']:.0f} s**",
             f"- a later start: **{run['later_start_s']:.0f} s**"]
    if "tests" in run:
        tests = run["tests"]
        lines.append(f"- `bash scripts/test.sh` on the same clone, with this machine's native builds cached: "
                     f"**{tests['seconds'] // 60:.0f} min "
                     f"{tests['seconds'] % 60:.0f} s** ({tests['summary'].strip('= ')})")
    return lines


def values(fig: dict, root: Path) -> list[str]:
    """Rows of `label: value`, each value a JSON path in a result file (`file:key.key`) or a ratio of two, with its
    standard error where the row names one."""
    def get(spec: str) -> float:
        file, _, path = spec.partition(":")
        value = read(root, file)
        for key in path.split("."):
            value = value[key]
        return value

    lines = []
    for row in fig["rows"]:
        value = get(row["value"]) / get(row["over"]) if "over" in row else get(row["value"])
        error = f" ± {get(row['se']):.3f}" if "se" in row else ""
        lines.append(f"- {row['label']}: **{row['format'].format(value)}**{error}")
    return lines


def fidelity(fig: dict, root: Path) -> list[str]:
    run = read(root, fig["results"])
    lines = ["| forward | agreeing positions | KL median | disagreements | reference margin at a disagreement: max |",
             "| --- | --- | --- | --- | --- |"]
    for row in run["precisions"].values():
        margin = row.get("margin_max")
        lines.append(f"| {row['forward']} | {100 * row['agreement']:.2f}% | {row['kl_median']:.1e} | "
                     f"{row['disagreements']} | {'–' if margin is None else f'{margin:.3f}'} |")
    return lines


KINDS = {"bench_domains": bench_domains, "fresh_clone": fresh_clone, "values": values, "fidelity": fidelity}


def render(fig: dict, machines: dict, root: Path) -> list[str]:
    return [where(fig, machines) + ":", "", *KINDS[fig["kind"]](fig, root)]


def build(root: Path = ROOT) -> tuple[str, dict[str, str]]:
    """The page, and each README block's text by figure id."""
    manifest = json.loads((root / MANIFEST).read_text())
    machines = manifest["machines"]
    page = ["# Current figures", "",
            "Generated by `python -m scripts.figures` from `docs/results/figures.json` and the result files it names; "
            "nothing here is typed in by hand. Each figure names its machine, date and command: these shared VMs move "
            "by more than a version does within a day, so compare ratios measured side by side in one run, not "
            "absolute figures across runs. The history behind them: the journals (`docs/journal/`) and "
            "[CHANGELOG.md](../CHANGELOG.md).", ""]
    blocks = {}
    for fig in manifest["figures"]:
        body = render(fig, machines, root)
        page += [f"## {fig['title']}", "", *body, ""]
        if fig.get("readme"):
            blocks[fig["id"]] = "\n".join(body) + "\n"
    return "\n".join(page).rstrip("\n") + "\n", blocks


def with_blocks(text: str, blocks: dict[str, str]) -> str:
    return BLOCK.sub(lambda m: m.group(1) + blocks.get(m.group(2), m.group(3)) + m.group(4), text)


def stale(root: Path = ROOT) -> list[str]:
    page, blocks = build(root)
    found = [] if (root / PAGE).is_file() and (root / PAGE).read_text() == page else [str(PAGE)]
    readme = (root / README).read_text()
    missing = set(blocks) - {m.group(2) for m in BLOCK.finditer(readme)}
    if with_blocks(readme, blocks) != readme or missing:
        found.append(f"{README} ({', '.join(sorted(missing)) or 'a block differs'})" if missing else str(README))
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 naming what is stale instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        if found:
            sys.exit(f"stale: {', '.join(found)}: python -m scripts.figures")
        return
    page, blocks = build()
    (ROOT / PAGE).write_text(page)
    (ROOT / README).write_text(with_blocks((ROOT / README).read_text(), blocks))


if __name__ == "__main__":
    main()
