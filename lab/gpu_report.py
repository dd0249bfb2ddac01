"""Figures for docs/gpu.md from the GPU run's results (docs/results/gpu/arch-*.json).

python -m lab.gpu_report docs/results/gpu/arch-2026-11-30.json --plot docs/gpu-speedup.png
python -m lab.gpu_report docs/results/gpu/arch-2026-12-04.json

Prints the verify cost table and the speedup a drafter of per-slot acceptance rate a would get at block
size K, derived from the measured costs: E[tokens per round] / (cost(K+1) + drafter cost), with
E = (1 - a^(K+1)) / (1 - a) and costs relative to a one-position forward. The engine's own per-round
overhead is counted as zero, which understates the speedup (it is paid once per round on both sides).
Where the run measured them, it also prints the oracle curve measured end to end through the engine beside
that derivation, and the compiled step's forwards (transformers eager, lean, CUDA graphs) against the
bandwidth floor with their verify costs.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RATES = [i / 20 for i in range(10, 21)]  # 0.5 .. 1.0


def expected_tokens(rate: float, k: int) -> float:
    return float(k + 1) if rate >= 1.0 else (1 - rate ** (k + 1)) / (1 - rate)


def derived_speedup(rate: float, k: int, relative_cost: dict, drafter_cost: float) -> float:
    return expected_tokens(rate, k) / (relative_cost[str(k + 1)] + drafter_cost)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    bf16 = results["qwen3_bf16"]
    curves = {int(c): v for c, v in bf16["verify_cost"].items()}
    one = curves[256]["seconds"]["1"]
    drafter = bf16["zlab_dflash"]["seconds_per_proposal"] / one
    print("| cached | " + " | ".join(str(t) for t in (1, 2, 4, 8, 9, 16, 17)) + " |")
    for c, v in curves.items():
        print(f"| {c} | " + " | ".join(f"{v['relative_to_one'][str(t)]:.2f}" for t in (1, 2, 4, 8, 9, 16, 17)) + " |")
    print(f"one-position forward {one * 1000:.1f} ms; z-lab DFlash proposal = {drafter:.3f} forwards")
    for k in (8, 16):
        row = [derived_speedup(a, k, curves[256]["relative_to_one"], drafter) for a in (0.6, 0.8, 0.9, 1.0)]
        print(f"K={k}: " + ", ".join(f"a={a}: {s:.2f}x" for a, s in zip((0.6, 0.8, 0.9, 1.0), row)))
    if "oracle" in bf16:
        print(oracle_table(bf16["oracle"], curves[256]["relative_to_one"], drafter))
    if "compiled_step" in results:
        print(compiled_table(results["compiled_step"]))
    if args.plot:
        plot(curves, drafter, Path(args.plot))


def oracle_table(rows: list[dict], relative_cost: dict, drafter_cost: float) -> str:
    """The oracle drafter's speedup measured end to end beside the one derived from the verify costs."""
    lines = ["| K | a | tokens per round | measured speedup | derived (drafter free of cost / z-lab cost) |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        k, a = row["block_size"], row["rate"]
        free, zlab = derived_speedup(a, k, relative_cost, 0.0), derived_speedup(a, k, relative_cost, drafter_cost)
        lines.append(f"| {k} | {a} | {row['acceptance_length']:.2f} | {row['speedup']:.2f}x | "
                     f"{free:.2f}x / {zlab:.2f}x |")
    return "\n".join(lines)


def compiled_table(step: dict, positions=(1, 2, 4, 8, 9, 16, 17)) -> str:
    """Tokens/s of each forward, its share of the bandwidth floor, and its verify cost at both contexts."""
    lines = ["| forward | tokens/s | of the floor | cached | " + " | ".join(map(str, positions)) + " | one position |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in positions) + " | --- |"]
    for name, forward in step["forwards"].items():
        for context, cost in forward["verify_cost"].items():
            cells = " | ".join(f"{cost['relative_to_one'][str(t)]:.2f}" for t in positions)
            lines.append(f"| {name} | {forward['tokens_per_s']:.1f} | {step['of_floor'][name]:.0%} | {context} | "
                         f"{cells} | {cost['seconds']['1'] * 1000:.1f} ms |")
    floor = step["bandwidth_floor_tokens_per_s"]
    lines.append(f"bandwidth floor: {floor:.0f} tokens/s; identical tokens: {step['identical_to_transformers']}; "
                 f"oracle through the graphs: {step['oracle_through_graphs']}")
    return "\n".join(lines)


def plot(curves: dict, drafter: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for c, v in curves.items():
        ts = sorted(int(t) for t in v["relative_to_one"])
        left.plot(ts, [v["relative_to_one"][str(t)] for t in ts], marker="o", label=f"{c} cached tokens")
    left.set(xlabel="new positions in one forward (K + 1)", ylabel="time / one-position forward",
             title="Qwen3-8B architecture, bf16, H200: verify cost (measured)")
    left.legend()
    for k in (8, 16):
        right.plot(RATES, [derived_speedup(a, k, curves[256]["relative_to_one"], drafter) for a in RATES],
                   marker=".", label=f"K = {k}")
    right.axhline(1.0, color="grey", lw=0.8)
    right.set(xlabel="per-slot acceptance rate a", ylabel="speedup over plain decoding",
              title="derived from the measured costs (not an end-to-end run)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
