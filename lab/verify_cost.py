"""The verify cost curve from the command line: one target forward over T new positions after a context of C cached
positions, T values interleaved across repeats (core.runtime.verify_cost measures it for the app).

python -m lab.verify_cost [--cached 256] [--repeats 20] [--target ID] [--out FILE.json] [--compare-cpu-linear]

--compare-cpu-linear times the target with both CPU linear kernels (core.runtime.cpu_linear: prepacked oneDNN, torch's
own) in one run, their passes interleaved so that load on the machine hits both alike.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from core.runtime.target import CPU_LINEARS, add_target_args, load_target, target_config_from_args
from core.runtime.verify_cost import POSITIONS, interleaved_costs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cached", type=int, default=256, help="positions already in the KV cache")
    parser.add_argument("--repeats", type=int, default=20, help="timed passes over the T values (median)")
    parser.add_argument("--positions", type=int, nargs="+", default=list(POSITIONS), help="T values to time")
    parser.add_argument("--out", default=None, help="also write the JSON result here")
    parser.add_argument("--compare-cpu-linear", action="store_true",
                        help="time both CPU linear kernels (onednn, torch) side by side, passes interleaved")
    add_target_args(parser)
    args = parser.parse_args(argv)
    kernels = CPU_LINEARS if args.compare_cpu_linear else (args.cpu_linear,)
    cfg = target_config_from_args(args)
    targets = {kernel: load_target(replace(cfg, cpu_linear=kernel)) for kernel in kernels}
    costs = interleaved_costs(targets, args.cached, args.repeats, sorted(set(args.positions) | {1}))
    curves = {kernel: {"seconds": cost, "relative_to_one": {t: s / cost[1] for t, s in cost.items()}}
              for kernel, cost in costs.items()}
    first = targets[kernels[0]]
    result = {"target": first.name, "context": args.cached, "repeats": args.repeats,
              "threads": torch.get_num_threads(),
              **(curves[kernels[0]] if len(kernels) == 1 else {"cpu_linear": curves})}
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
