"""Figures for docs/gpu.md from the GPU run's results (docs/results/gpu/arch-*.json).

python -m scripts.gpu_report docs/results/gpu/arch-2026-11-30.json --plot docs/gpu-speedup.png

Prints the verify cost table and the speedup a drafter of per-slot acceptance rate a would get at block
size K, derived from the measured costs: E[tokens per round] / (cost(K+1) + drafter cost), with
E = (1 - a^(K+1)) / (1 - a) and costs relative to a one-position forward. The engine's own per-round
overhead is counted as zero, which understates the speedup (it is paid once per round on both sides).
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
    bf16 = json.loads(Path(args.results).read_text())["qwen3_bf16"]
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
    if args.plot:
        plot(curves, drafter, Path(args.plot))


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
