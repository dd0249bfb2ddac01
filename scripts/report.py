"""Regenerate docs/benchmarks.md and its plots from the bench runs in docs/results/.

python -m scripts.report [--results docs/results] [--out docs]

Reads the JSON written by `python -m app.suite` / `python -m lab.verify_cost` (scripts/bench_report.sh
runs them) and writes docs/benchmarks.md plus PNGs beside it. Every number in the report is read from
those files; nothing is typed in by hand.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from drafter.spec import RunSpec  # noqa: E402
from scripts.results import read_json  # noqa: E402

DOMAINS = ("math", "code", "chat")
MAIN_ORDER = ("ngram", "hf-prompt-lookup", "dflash", "flashmap,steps=1", "flashmap,steps=2",
              "flashmap,steps=1,adaptive=1,skip=0", "flashmap,steps=1,adaptive=1")
SLOT_DRAFTERS = ("dflash", "flashmap,steps=1", "flashmap,steps=2")
# the 2-step shuffle test (§6.2), paired two ways (shuffle_section): (results name, which flow map it measured)
SHUFFLE_RUNS = (
    ("offline-variants-stride16", "version 0.16's flow map"),
    ("offline-shuffle-coupled-stride16", "version 0.16's flow map"),
    ("offline-shuffle-stride8", "version 0.16's flow map"),
    ("offline-shuffle-coupled-stride8", "version 0.16's flow map"),
    ("offline-shuffle-coupled-stride4", "version 0.16's flow map"),
    ("offline-shuffle-coupled-teacher-stride32", "version 0.16's flow map"),
)


def load(folder: Path, name: str) -> dict | None:
    """The newest run of this name: docs/results/NAME-YYYY-MM-DD.json (bench_report.sh dates every run it writes), or
    the same gzipped (.json.gz: the large per-position runs, kept compressed within the repository's budget)."""
    pattern = f"{name}-20[0-9][0-9]-[0-9][0-9]-[0-9][0-9].json"
    runs = sorted([*folder.glob(pattern), *folder.glob(pattern + ".gz")], key=lambda path: path.name.split(".")[0])
    return read_json(runs[-1]) if runs else None


def fmt(value, digits=2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def by_variant(run: dict) -> dict[str, dict]:
    return {r["variant"]: r for r in run["results"]}


def pooled_slots(rows: list[dict]) -> list[float | None]:
    """Conditional acceptance per slot pooled over runs from the raw counts."""
    reached = [sum(c) for c in zip(*(r["per_slot_reached"] for r in rows))]
    accepted = [sum(c) for c in zip(*(r["per_slot_accepted"] for r in rows))]
    return [a / n if n else None for a, n in zip(accepted, reached)]


def main_table(run: dict, domain: str, temperature: int) -> list[str]:
    rows = by_variant(run)
    any_row = next(iter(rows.values()))
    lines = [f"**{domain}, T={temperature}** — {any_row['prompts']} prompts, {run['max_new_tokens']} new tokens, "
             f"K={any_row['block_size']}", "",
             "| drafter | tokens/s | speedup | acceptance length | identical to plain |", "|---|---|---|---|---|",
             f"| plain decoding | {fmt(any_row['baseline_tokens_per_s'], 1)} | 1.00× | 1.00 | — |"]
    for name in MAIN_ORDER:
        if name in rows:
            r = rows[name]
            same = {True: "yes", False: "**no**", None: "n/a (T>0)"}[r["identical_to_baseline"]]
            lines.append(f"| {label(name)} | {fmt(r['tokens_per_s'], 1)} | {fmt(r['speedup'])}× | "
                         f"{fmt(r['acceptance_length'])} | {same} |")
    return lines + [""]


def plot_speedups(mains: dict, out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    for ax, temperature in zip(axes, (0, 1)):
        width = 0.8 / len(MAIN_ORDER)
        for i, name in enumerate(MAIN_ORDER):
            values = [by_variant(mains[(d, temperature)]).get(name, {}).get("speedup") if (d, temperature) in mains
                      else None for d in DOMAINS]
            ax.bar([j + i * width for j in range(len(DOMAINS))], [v or 0 for v in values], width, label=label(name))
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(DOMAINS))], DOMAINS)
        ax.set_title(f"T = {temperature}")
        ax.set_ylabel("speedup over plain decoding")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.17, 1, 1))  # the legend sits below both panels, clear of the bars
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_k_sweep(run: dict, out: Path) -> list[str]:
    series: dict[str, list[tuple[int, float]]] = {}
    for r in run["results"]:
        base = ",".join(part for part in r["variant"].split(",") if not part.startswith("k="))
        series.setdefault(base, []).append((r["block_size"], r["acceptance_length"]))
    ks = sorted({k for pts in series.values() for k, _ in pts})
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in series.items():
        pts.sort()
        ax.plot([k for k, _ in pts], [a for _, a in pts], marker="o", label=label(name))
    ax.set_xlabel("proposal length K")
    ax.set_ylabel("acceptance length (tokens per target forward)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    lines = ["| drafter | " + " | ".join(f"K={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for name, pts in series.items():
        got = dict(pts)
        lines.append(f"| {label(name)} | " + " | ".join(fmt(got.get(k)) for k in ks) + " |")
    return lines + [""]


def plot_slots(mains: dict, out: Path, temperature: int = 0) -> list[str]:
    fig, ax = plt.subplots(figsize=(6, 4))
    lines = ["| drafter | " + " | ".join(str(k) for k in range(1, 17)) + " |", "|---|" + "---|" * 16]
    for name in SLOT_DRAFTERS:
        rows = [by_variant(run)[name] for (d, t), run in mains.items() if t == temperature and name in by_variant(run)]
        if not rows:
            continue
        rates = pooled_slots(rows)
        ax.plot(range(1, len(rates) + 1), [r if r is not None else float("nan") for r in rates], marker="o",
                label=label(name))
        lines.append(f"| {label(name)} | " + " | ".join(fmt(r) for r in rates) + " |")
    ax.set_xlabel("slot k")
    ax.set_ylabel("P(slot k accepted | slots < k accepted)")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return lines + [""]


def shuffle_table(run: dict) -> list[str]:
    rows = by_variant(run)
    lines = ["| drafter | shared noise | per-slot independent noise | Δ |", "|---|---|---|---|"]
    for name, r in rows.items():
        if "noise=shuffled" in name:
            continue
        shuffled = rows.get(name + ",noise=shuffled")
        if shuffled is None:
            continue
        a, b = r["acceptance_length"], shuffled["acceptance_length"]
        lines.append(f"| {label(name)} | {fmt(a, 3)} | {fmt(b, 3)} | {a - b:+.3f} |")
    return lines + [""]


def targets_section(mains: dict, shuffle: dict | None, val: dict | None, sparse: dict | None) -> list[str]:
    """The trained drafters' acceptance targets, checked against the runs above."""
    lines = ["| target | measured | met |", "|---|---|---|"]
    for domain, bound in (("math", 1.5), ("code", 1.5), ("chat", 1.2)):
        r = by_variant(mains[(domain, 0)]).get("flashmap,steps=1") if (domain, 0) in mains else None
        if r:
            ok = r["speedup"] >= bound and r["identical_to_baseline"]
            lines.append(f"| FlashMap 1-step K=16 T=0 on {domain}: identical and ≥ {bound}× | {r['speedup']:.2f}×, "
                         f"identical {r['identical_to_baseline']} | {'yes' if ok else 'no'} |")
    rows = [(by_variant(mains[(d, 0)]).get("flashmap,steps=1"), by_variant(mains[(d, 0)]).get("dflash"))
            for d in DOMAINS if (d, 0) in mains]
    rows = [(f, d) for f, d in rows if f and d]
    if rows:
        wins = sum(f["acceptance_length"] > d["acceptance_length"] for f, d in rows)
        mean_f = sum(f["speedup"] for f, _ in rows) / len(rows)
        mean_d = sum(d["speedup"] for _, d in rows) / len(rows)
        lines.append(f"| FlashMap 1-step beats DFlash-style in acceptance length on ≥ 2 of 3 domains (T=0) | "
                     f"{wins} of {len(rows)} | {'yes' if wins >= 2 else 'no'} |")
        lines.append(f"| ... and in mean speedup (T=0) | {mean_f:.2f}× vs {mean_d:.2f}× | "
                     f"{'yes' if mean_f > mean_d else 'no'} |")
    if shuffle:
        rows2 = by_variant(shuffle)
        a, b = rows2.get("flashmap,steps=2"), rows2.get("flashmap,steps=2,noise=shuffled")
        if a and b:
            delta = a["acceptance_length"] - b["acceptance_length"]
            lines.append(f"| FlashMap 2-step Δ > 0 in the shuffle test (engine, {a['prompts']} prompts) | "
                         f"Δ = {delta:+.3f} | {'yes' if delta > 0 else 'no'} |")
    return lines + offline_target_rows(val, sparse) + [""]


def offline_target_rows(val: dict | None, sparse: dict | None) -> list[str]:
    """The same two claims on the offline held-out runs, where the sample is large enough to tell."""
    lines = []
    if val and {"flashmap", "dflash"} <= set(by_variant(val)):
        rows = by_variant(val)
        got = {d: paired_delta(rows["flashmap"], rows["dflash"], d, val) for d in DOMAINS}
        wins = sum(g[0] > 2 * g[1] for g in got.values() if g)
        cells = ", ".join(f"{d} {g[0]:+.3f} ± {g[1]:.3f}" for d, g in got.items() if g)
        lines.append(f"| ... offline on held-out responses ({rows['flashmap']['all']['rounds']:,} rounds): FlashMap "
                     f"1-step − DFlash-style accepted tokens | {cells} | {'yes' if wins >= 2 else 'no'} |")
    if sparse and {"flashmap,steps=2", "flashmap,steps=2,noise=shuffled"} <= set(by_variant(sparse)):
        rows = by_variant(sparse)
        delta, se, n = paired_delta(rows["flashmap,steps=2"], rows["flashmap,steps=2,noise=shuffled"], "all", sparse)
        lines.append(f"| ... shuffle test offline ({n:,} rounds, paired) | Δ = {delta:+.3f} ± {se:.3f} | "
                     f"{'yes' if delta > 2 * se else 'no (not above 2 standard errors)'} |")
    return lines


def label(variant: str) -> str:
    """The people's label of a variant, from its drafter spec (drafter/spec.py)."""
    return RunSpec.parse(variant).describe()


def paired_delta(a: dict, b: dict, domain: str, run: dict) -> tuple[float, float, int] | None:
    """Mean and standard error of a - b in accepted slots per round over the same anchors."""
    ra, rb = a["rounds"], b["rounds"]
    if ra["sequence"] != rb["sequence"]:
        return None
    domains = run["sequence_domains"]
    diffs = [x - y for s, x, y in zip(ra["sequence"], ra["n_accepted"], rb["n_accepted"])
             if domain == "all" or domains[s] == domain]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / max(1, n - 1)
    return mean, (var / n) ** 0.5, n


def clustered_delta(a: dict, b: dict, run: dict) -> tuple[float, float, int] | None:
    """paired_delta over all rounds with the standard error clustered by response: rounds of one response share its
    text and are not independent (the ratio estimator's variance over responses, with the g / (g - 1) correction).
    -> (mean, standard error, responses)"""
    ra, rb = a["rounds"], b["rounds"]
    if ra["sequence"] != rb["sequence"]:
        return None
    sums, counts = {}, {}
    for s, x, y in zip(ra["sequence"], ra["n_accepted"], rb["n_accepted"]):
        sums[s], counts[s] = sums.get(s, 0) + x - y, counts.get(s, 0) + 1
    n, g = sum(counts.values()), len(sums)
    mean = sum(sums.values()) / n
    var = sum((sums[s] - counts[s] * mean) ** 2 for s in sums) / n**2 * g / max(1, g - 1)
    return mean, var**0.5, g


def offline_table(runs: list[dict]) -> list[str]:
    domains = [d for d in DOMAINS if d in runs[0]["results"][0]] + ["all"]
    lines = ["| drafter | " + " | ".join(domains) + " | rounds (all) |", "|---|" + "---|" * (len(domains) + 1)]
    for run in runs:
        for r in run["results"]:
            lines.append(f"| {label(r['variant'])} | "
                         + " | ".join(fmt(r[d]["acceptance_length"], 3) for d in domains)
                         + f" | {r['all']['rounds']:,} (anchor stride {run['stride']}) |")
    return lines + [""]


def delta_rows(run: dict, pairs: list[tuple[str, str, str]]) -> list[str]:
    rows = by_variant(run)
    domains = [d for d in DOMAINS if d in run["results"][0]] + ["all"]
    lines = []
    for label, a, b in pairs:
        if a in rows and b in rows:
            cells = []
            for d in domains:
                got = paired_delta(rows[a], rows[b], d, run)
                cells.append("—" if got is None else f"{got[0]:+.3f} ± {got[1]:.3f}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def offline_section(val: dict, sparse: dict | None, phase1: dict | None, seen: dict | None) -> list[str]:
    domains = [d for d in DOMAINS if d in val["results"][0]] + ["all"]
    head = ["| comparison | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    doc = ["## Acceptance on held-out responses, offline (many rounds)", "",
           f"`python -m drafter.evaluation.evaluate` (T=0, K={val['block_size']}): {val['sequences']} greedy SmolLM2 "
           "responses "
           "to train_* prompts that no drafter was trained on (`data/smollm2-val`). At T=0 the output is fixed, so the "
           "tokens a round anchored at any position would accept follow from the draft alone; every listed anchor "
           "is drafted, batched, without running the target. Same anchors for every drafter in a file: differences "
           "are paired (± one standard error over rounds). Acceptance length = 1 + accepted draft tokens.", ""]
    doc += offline_table([val] + ([sparse] if sparse else []))
    doc += ["FlashMap against the DFlash-style baseline, accepted tokens per round (paired):", ""] + head
    doc += delta_rows(val, [("FlashMap 1-step − DFlash-style", "flashmap", "dflash"),
                            ("FlashMap 2-step − DFlash-style", "flashmap,steps=2", "dflash")])
    if sparse:
        doc += delta_rows(sparse, [("FlashMap 1-step best of 4 − 1-step", "flashmap,best_of=4", "flashmap"),
                                   ("flow teacher 16 steps, noise × 0.3 − noise × 1",
                                    "flashmap-teacher,steps=16,scale=0.3", "flashmap-teacher,steps=16")])
        doc += ["", "Shuffle test (paper Table 2) offline: shared noise − per-slot independent noise (paired; the "
                "teacher's 16-step version is in the engine run above, as K independent 16-step draws per block "
                "are too dear for thousands of rounds here):", ""] + head
        doc += delta_rows(sparse, [("FlashMap 1-step", "flashmap", "flashmap,noise=shuffled"),
                                   ("FlashMap 2-step", "flashmap,steps=2", "flashmap,steps=2,noise=shuffled")])
    doc += [""]
    if phase1:
        doc += ["Before the second training phase (the phase-1 checkpoints of commit 98e80ee, same anchors):", ""]
        doc += offline_table([phase1])
    if seen:
        doc += [f"On responses the drafters were trained on ({seen['sequences']} of them, `{seen['data']}`), "
                "to compare with the held-out figures above (a gap = memorised data):", ""]
        doc += offline_table([seen])
    return doc


def tree_section(engine: dict[str, dict], offline: list[dict]) -> list[str]:
    """Paper App. D: several drafts from independent noise, merged into a trie, verified in one forward."""
    doc = ["## Multi-sample drafting with tree verification (paper App. D), T=0", "",
           "M blocks drafted from independent noise in one batched pass, merged into a trie of at most K nodes "
           "(breadth-first, so a small K keeps the first slots of every draft) and verified in one target forward "
           "with a tree attention mask; the target's greedy path walks down whichever branch holds its argmax. "
           "Lossless at T=0 (every output below is identical to plain decoding); at T>0 the app uses one draft.", ""]
    for domain, run in engine.items():
        rows = run["results"]
        doc += [f"**{domain}** — {rows[0]['prompts']} prompts, {run['max_new_tokens']} new tokens, "
                "one side-by-side run", "",
                "| drafter | tokens/s | speedup | acceptance length | identical to plain |", "|---|---|---|---|---|",
                f"| plain decoding | {fmt(rows[0]['baseline_tokens_per_s'], 1)} | 1.00× | 1.00 | — |"]
        for r in rows:
            same = {True: "yes", False: "**no**", None: "n/a"}[r["identical_to_baseline"]]
            doc.append(f"| {label(r['variant'])} | {fmt(r['tokens_per_s'], 1)} | {fmt(r['speedup'])}× | "
                       f"{fmt(r['acceptance_length'])} | {same} |")
        doc.append("")
    for run in offline:
        domains = [d for d in DOMAINS if d in run["results"][0]] + ["all"]
        doc += [f"Offline on the held-out responses, K={run['block_size']} (`python -m drafter.evaluation.evaluate`, "
                "same anchors "
                "for every row, so the differences are paired):", ""]
        doc += ["| drafter | " + " | ".join(domains) + " | rounds (all) |", "|---|" + "---|" * (len(domains) + 1)]
        for r in run["results"]:
            doc.append(f"| {label(r['variant'])} | " + " | ".join(fmt(r[d]["acceptance_length"], 3) for d in domains)
                       + f" | {r['all']['rounds']:,} |")
        trees = [r["variant"] for r in run["results"] if ",tree=" in r["variant"]]
        chain = {spec: ",".join(o for o in spec.split(",") if not o.startswith("tree=")) for spec in trees}
        pairs = [(f"{label(spec)} − {label(chain[spec])}", spec, chain[spec]) for spec in trees]
        doc += ["", "| comparison (accepted tokens per round) | " + " | ".join(domains) + " |",
                "|---|" + "---|" * len(domains)] + delta_rows(run, pairs) + [""]
    return doc


def build(results: Path, out: Path) -> str:
    mains = {(d, t): run for d in DOMAINS for t in (0, 1) if (run := load(results, f"drafters-{d}-t{t}"))}
    doc = ["# Benchmarks: SmolLM2-135M-Instruct on a 2-core CPU", "",
           "Generated by `python -m scripts.report` from the JSON files in `docs/results/`, which "
           "`bash scripts/bench_report.sh` writes (each file is one side-by-side run: for every prompt, plain "
           "decoding and every drafter run back to back, in a rotating order). Speedups are ratios of "
           "tokens/s within one run.", ""]
    if mains:
        doc += ["## The trained drafters' targets", ""] + targets_section(mains, load(results, "shuffle-test-t0"),
                                                             load(results, "offline-val-stride2"),
                                                             load(results, "offline-val-stride16"))
        doc += ["## Speedup and acceptance length", ""]
        for key in sorted(mains, key=lambda k: (k[1], DOMAINS.index(k[0]))):
            doc += main_table(mains[key], *key)
        plot_speedups(mains, out / "bench-speedup.png")
        doc += ["![speedup per domain](bench-speedup.png)", ""]
    if ksweep := load(results, "k-sweep-t0"):
        doc += ["## Acceptance length against proposal length K (paper Fig. 2)", "",
                f"T=0, prompts: {', '.join(Path(p).name for p in ksweep['prompts_files'])}, first "
                f"{ksweep['limit']} of each.", ""]
        doc += plot_k_sweep(ksweep, out / "bench-k-sweep.png")
        doc += ["![acceptance length vs K](bench-k-sweep.png)", ""]
    if mains:
        doc += ["## Conditional acceptance per slot (paper Fig. 3)", "",
                "Pooled over the three T=0 runs above: the rate at slot k among rounds that reached slot k.", ""]
        doc += plot_slots(mains, out / "bench-slots.png")
        doc += ["![per-slot acceptance](bench-slots.png)", ""]
    for t in (0, 1):
        if shuffle := load(results, f"shuffle-test-t{t}"):
            first = shuffle["results"][0]
            doc += [f"## Shuffle test (paper Table 2), T={t}", "",
                    f"Acceptance length with one noise draw shared by the block against each slot taken from its "
                    f"own independent draw (same per-slot marginals, no joint structure); {first['prompts']} "
                    f"prompts, K={first['block_size']}.", ""]
            doc += shuffle_table(shuffle)
    tree_runs = {d: run for d in DOMAINS if (run := load(results, f"tree-{d}-t0"))}
    tree_offline = [run for name in ("offline-tree", "offline-tree-k4") if (run := load(results, name))]
    if tree_runs or tree_offline:
        doc += tree_section(tree_runs, tree_offline)
    if val := load(results, "offline-val-stride2"):
        doc += offline_section(val, load(results, "offline-val-stride16"), None, load(results, "offline-seen"))
    doc += ["## Verify cost and speed against llama.cpp", "",
            "The engine's verify cost per precision, its speed against plain decoding and llama.cpp, and the thread "
            "policy are measured by `bash scripts/engine_ladder.sh` and tabled in `docs/journal/engine.md` "
            "(`docs/results/engine/`).", ""]
    doc += curves_section(results / "curves", out / "learning-curves.png")
    if final := load(results, "offline-acceptance-stride16"):
        doc += acceptance_section(final)
    if shuffles := [(run, which) for name, which in SHUFFLE_RUNS if (run := load(results, name))]:
        doc += shuffle_section(shuffles)
    if profile := load(results, "train-profile"):
        doc += profile_section(profile)
    if walk := load(results, "offline-walk"):
        doc += walk_section(walk, load(results, "offline-acceptance-stride16"))
    if (results / "calibration.json").exists():
        calibration = json.loads((results / "calibration.json").read_text())
        doc += calibration_section(calibration, [run for name in ("policy-ab-t0", "policy-ab-2step-t0",
                                                                  "policy-ab-t1") if (run := load(results, name))])
    return "\n".join(doc)


def walk_section(walk: dict, uniform: dict | None) -> list[str]:
    """Version 0.10: held-out acceptance at the anchors the engine's rounds visit, beside the uniform-anchor figure."""
    doc = ["## Acceptance where the engine's rounds fall (version 0.10)", "",
           "`python -m drafter.evaluation.evaluate --data data/smollm2-val --walk`: each response walked as the engine "
           "walks it "
           "at T = 0 without a cut (the next anchor one accepted block after the last), "
           f"{walk['results'][0]['all']['rounds']:,} rounds per drafter. Rounds crowd where drafts fail, so tokens per "
           "round here is lower than the every-16th-anchor average that the acceptance targets use, and it is what the "
           "engine's acceptance length is at K = 16.", ""] + acceptance_rows(walk)
    if uniform:
        by_variant = {r["variant"]: r["all"]["acceptance_length"] for r in uniform["results"]}
        rows = [f"{label(r['variant'])}: {by_variant[r['variant']]:.3f} → {r['all']['acceptance_length']:.3f}"
                for r in walk["results"] if r["variant"] in by_variant]
        doc += ["Every 16th anchor → the engine's anchors: " + "; ".join(rows) + ".", ""]
    return doc


def calibration_section(calibration: dict, ab_runs: list[dict]) -> list[str]:
    """Version 0.10: what the adaptive cut believes about a draft (raw and calibrated confidence, held out) and the
    draft policy that reads it, against the one before, in the engine."""
    doc = ["## What the adaptive cut believes: calibrated confidence and the drafter's cost (version 0.10)", "",
           f"`python -m drafter.evaluation.calibrate --data data/smollm2-val --stride {calibration['stride']} "
           "--variants …`: at "
           "every anchor of the held-out responses, the expected accepted slots of a full draft that the cut computes "
           "from each slot's confidence (sum_k prod_{j<=k} c_j) against the slots the target accepted; calibrated = "
           "per-slot Platt maps fitted on the other half of the sequences (two folds by sequence).", "",
           "| drafter | domain | rounds | accepted | expected, raw confidence | expected, calibrated |",
           "|---|---|---|---|---|---|"]
    for r in calibration["results"]:
        for domain, row in r["held_out"].items():
            doc.append(f"| {label(r['variant'])} | {domain} | {row['rounds']:,} | {row['accepted']:.2f} | "
                       f"{row['expected_raw']:.2f} | {row['expected_calibrated']:.2f} |")
    if not ab_runs:
        return doc + [""]
    doc += ["", "`python -m lab.policy_ab --prompts eval_math eval_code eval_chat --limit N --max-new-tokens 96 "
            "--drafters … [--temperature 1]` (app.suite's rotation, one plain baseline, background training paused; "
            "the lines in scripts/bench_report.sh; measured with version 0.10's checkpoints): the adaptive policy now "
            "(**new**: calibrated confidence at T = 0, each draft charged for the drafter's call when deciding to "
            "skip the next) against **before** (raw confidence, no drafter cost) and the two halves alone "
            "(calibrated: no drafter cost; charged: raw confidence). Drafts verified = rounds whose draft reached the "
            "target (a cut to nothing or a skip makes a plain step).", "",
            "| T | drafter | policy | math | code | chat | all | drafter cost | drafts verified / rounds | identical |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for run in ab_runs:
        for r in run["results"]:
            spec, _, arm = r["variant"].partition(" [")
            sp = domain_speedups(run, r)
            charged = f"{r['draft_cost']:.2f}" if "draft_cost" not in r.get("overrides", {}) else "not charged"
            same = "yes" if r["identical_to_baseline"] else ("—" if run["temperature"] else "**no**")
            doc.append(f"| {run['temperature']:g} | {label(spec)} ({run['limit']} prompts each) | {arm.rstrip(']')} | "
                       + " | ".join(f"{sp[d]:.2f}×" for d in ("math", "code", "chat", "all"))
                       + f" | {charged} | {r['per_slot_reached'][0]} / {r['rounds']} | {same} |")
    if any(run["temperature"] for run in ab_runs):
        doc += ["", "The T = 1 rows were measured at commit e49702e, when the skips charged the drafter at every "
                "temperature; since then nothing is charged at T > 0 (`GenerationConfig.charges_draft_cost`: there the "
                "confidence is not calibrated), so the app's T = 1 default runs as *before*."]
    return doc + [""]


def domain_speedups(run: dict, result: dict) -> dict[str, float]:
    """Tokens/s against plain decoding per prompt file (the suite runs the first `limit` prompts of each, in order)."""
    files = [Path(f).stem.removeprefix("eval_") for f in run["prompts_files"]]
    groups = {name: result["per_prompt"][i * run["limit"]:(i + 1) * run["limit"]] for i, name in enumerate(files)}
    groups["all"] = result["per_prompt"]

    def rate(rows, tokens, seconds):
        return sum(r[tokens] for r in rows) / sum(r[seconds] for r in rows)
    return {name: rate(rows, "tokens", "s") / rate(rows, "baseline_tokens", "baseline_s")
            for name, rows in groups.items()}


def acceptance_rows(run: dict, with_ce: bool = False) -> list[str]:
    """A table of each variant's held-out acceptance length per domain (and its slots' cross-entropy)."""
    domains = [d for d in DOMAINS if d in run["results"][0]] + ["all"]
    ce_head = " | cross-entropy, slots 1–4 (nats)" if with_ce else ""
    lines = ["| drafter | " + " | ".join(domains) + ce_head + " |", "|---|" + "---|" * (len(domains) + with_ce)]
    for r in run["results"]:
        ce = (" | " + " / ".join(f"{x:.2f}" for x in r["per_slot_cross_entropy"][:4])) if with_ce else ""
        weights = f" (`{r['weights']}`)" if r.get("weights") else ""
        lines.append(f"| {label(r['variant'])}{weights} | "
                     + " | ".join(fmt(r[d]["acceptance_length"], 3) for d in domains) + ce + " |")
    return lines + [""]


def delta_table(run: dict, pairs: list[tuple[str, str, str]]) -> list[str]:
    domains = [d for d in DOMAINS if d in run["results"][0]] + ["all"]
    return (["| comparison (accepted tokens per round, paired) | " + " | ".join(domains) + " |",
             "|---|" + "---|" * len(domains)] + delta_rows(run, pairs) + [""])


def coupled(run: dict) -> bool:
    """Whether a run's shuffled draws kept each slot's own noise of the shared draft (drafter.evaluation.evaluate
    records it from version 0.17; before, they were independent of it)."""
    return run.get("shuffled_noise") == "coupled"


def ordinal(n: int) -> str:
    """4 -> '4th', 32 -> '32nd', 21 -> '21st', 13 -> '13th'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def shuffle_section(runs: list[tuple[dict, str]]) -> list[str]:
    """The shuffle test's Δ with each run's pairing of the noise: independent draws, then (0.17 on) coupled ones."""
    domains = [d for d in DOMAINS if d in runs[0][0]["results"][0]] + ["all"]
    lines = ["## The shuffle test, paired two ways", "",
             "`python -m drafter.evaluation.evaluate --data data/smollm2-val --stride N --variants flashmap,steps=2 "
             "flashmap,steps=2,noise=shuffled`: the 2-step draft from one shared noise draw against each slot from its "
             "own draw (paper §6.2), T = 0, K = 16, paired on the same anchors. Until version 0.16 the per-slot draws "
             "were independent of the shared draw; from version 0.17 draw k keeps slot k's noise of the shared draft "
             "and only the other slots' noise is fresh (`drafting.BlockSampler._shuffled`). Both estimate the same Δ "
             "(each variant's own distribution is unchanged); the coupled one leaves out the variance of each slot's "
             "own draw, which is not the joint structure the test is about.", "",
             "| Δ = shared − shuffled (accepted tokens per round) | " + " | ".join(domains)
             + " | all, standard error clustered by response | rounds |", "|---|" + "---|" * (len(domains) + 2)]
    for run, which in runs:
        pairing = "coupled" if coupled(run) else "independent"
        rows = by_variant(run)
        for shared, drafter in (("flashmap,steps=2", which), ("flashmap-teacher,steps=16", "its teacher, 16 steps")):
            label = f"{drafter}, every {ordinal(run['stride'])} anchor, {pairing}"
            for row in delta_rows(run, [(label, shared, shared + ",noise=shuffled")]):
                mean, se, g = clustered_delta(rows[shared], rows[shared + ",noise=shuffled"], run)
                lines.append(row + f" {mean:+.3f} ± {se:.3f} ({g} responses) | {rows[shared]['all']['rounds']:,} |")
    return lines + [""]


def shuffle_pairing(run: dict) -> str:
    """How a run's shuffled draws were paired with the shared ones, for the issue's table."""
    if coupled(run):
        return (", coupled: each slot's own noise is the shared draft's, only the other slots' noise differs "
                "(common random numbers; the same expectation, less variance)")
    return ", independent of the shared draft's noise (before version 0.17)"


def acceptance_section(run: dict) -> list[str]:
    """The shipped drafters' offline acceptance, paired on the same anchors."""
    names = [r["variant"] for r in run["results"]]
    pairs = [(f"{label(a)} − {label(b)}", a, b) for a, b in (
        ("flashmap,scale=0", "dflash"), ("flashmap", "dflash"), ("flashmap,steps=2,scale=0", "flashmap,scale=0"),
        ("flashmap,steps=2", "flashmap"), ("flashmap,scale=0", "flashmap"),
        ("flashmap,steps=2", "flashmap,steps=2,noise=shuffled"))
        if a in names and b in names]
    for name in names:  # a variant with weights= is another checkpoint of the same drafter (previous or candidate)
        base = ",".join(part for part in name.split(",") if not part.startswith("weights="))
        if base != name and base in names:
            pairs.append((f"{label(base)}: shipped − `{name.split('weights=')[1]}`", base, name))
    return (["## The acceptance targets, offline", "",
             f"`python -m drafter.evaluation.evaluate --data data/smollm2-val --stride {run['stride']}` "
             "(T = 0, K = 16, "
             f"{run['results'][0]['all']['rounds']:,} rounds per drafter, the checkpoints shipped when it ran). The "
             "last row is the 2-step shuffle test (paper Table 2): one shared noise draw against each slot from its "
             "own draw" + shuffle_pairing(run) + ".", ""]
            + acceptance_rows(run) + delta_table(run, pairs))


def profile_section(rows: list[dict]) -> list[str]:
    """Where a training step's time goes (python -m scripts.profile_train)."""
    stages = [r for r in rows if "phases_s" in r]
    doc = ["## Learning per CPU-second: a training step profiled", "",
           "`python -m scripts.profile_train --threads 2 --jobs 2` on `data/smollm2-responses` (128 blocks per step, "
           "bf16 autocast). Seconds per step without the profiler, the context kept factored (each pool position "
           "projected once per step, `network.PooledContext`) against the gathered per-block context it replaced; "
           "then the profiler's shares of the step (it roughly doubles a step's time, so read shares).", "",
           "| stage | s/step factored | s/step gathered | speedup | batch | forward + loss | backward | optimizer "
           "| top operators (share of self time) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in stages:
        pooled, gathered = (sum(v) / len(v) for v in (r["seconds_per_step"]["pooled"],
                                                       r["seconds_per_step"]["gathered"]))
        total_phase = sum(r["phases_s"].values())
        share = {k: v / total_phase for k, v in r["phases_s"].items()}
        ops_total = sum(r["operators_s"].values())
        ops = ", ".join(f"{k.replace('_', ' ')} {v / ops_total:.0%}" for k, v in list(r["operators_s"].items())[:4])
        doc.append(f"| {r['stage']} | {pooled:.3f} | {gathered:.3f} | {gathered / pooled:.2f}× | "
                   + " | ".join(f"{share.get(k, 0):.0%}" for k in ("batch", "forward_loss", "backward", "optimizer"))
                   + f" | {ops} |")
    for r in rows:
        if "ratio" in r:
            one, many = (v for k, v in r.items() if k.endswith("steps_per_s"))
            doc += ["", f"One {r['stage']} job on 2 threads: {one:.2f} steps/s; two one-thread jobs at once: "
                        f"{many:.2f} steps/s together ({r['ratio']:.2f}×). Two drafters train side by side on one "
                        "thread each (this version's background runs)."]
    return doc + [""]


def curves_section(folder: Path, png: Path) -> list[str]:
    """Held-out acceptance against CPU-hours of each drafter's open-ended training run (python -m
    drafter.training.loop)."""
    curves = {path.stem: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
              for path in sorted(folder.glob("*.jsonl"))} if folder.exists() else {}
    curves = {name: rows for name, rows in curves.items() if rows}
    if not curves:
        return []
    fig, ax = plt.subplots(figsize=(7, 3.4), layout="constrained")
    doc = ["## Learning curves", "",
           "Held-out acceptance length (K = 16, T = 0, every 16th anchor of `data/smollm2-val`, offline) of each "
           "drafter's training run under `python -m drafter.training.loop`, against the CPU-hours the run has spent "
           "(training and its own measurements; `docs/results/curves/`).", "",
           "| run | drafted as | measurements | CPU-hours | first | last | best |", "|---|---|---|---|---|---|---|"]
    for name, rows in curves.items():
        hours = [r["cpu_hours"] for r in rows]
        values = [r["acceptance"]["all"] for r in rows]
        ax.plot(hours, values, marker="o", label=name)
        drafted = ", ".join(f"`{d}`" for d in dict.fromkeys(r.get("drafter", name) for r in rows))
        doc.append(f"| {name} | {drafted} | {len(rows)} | {hours[-1]:.2f} | {values[0]:.3f} | {values[-1]:.3f} | "
                   f"{max(values):.3f} |")
    ax.set_xlabel("CPU-hours of the run")
    ax.set_ylabel("acceptance length (held-out)")
    ax.legend(fontsize=8)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return doc + ["", f"![learning curves]({png.name})", ""]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="docs/results")
    parser.add_argument("--out", default="docs")
    args = parser.parse_args(argv)
    out = Path(args.out)
    text = build(Path(args.results), out)
    (out / "benchmarks.md").write_text(text + "\n")
    print(f"wrote {out / 'benchmarks.md'}")


if __name__ == "__main__":
    main()
