"""The target's forward through two builds of the native step side by side: this CPU's own build and either the one it
compiles with some instruction sets turned off (another CPU's products, core/runtime/csrc/products.h) or the one an
earlier commit's sources make (`--commit`, what a change to the step gained), forwards over 1..17 positions interleaved
pass by pass (core.runtime.verify_cost.interleaved_costs), each build at its own default prefetch distance or at one
given for both.

python -m lab.products_ab --without avx512vnni [--cached 256] [--repeats 40] [--prefetch 0] \
    --out docs/results/engine/products-ab-DATE.json
python -m lab.products_ab --commit REV [--cached 128] --out docs/results/engine/step-ab-DATE.json

Prints and writes the median milliseconds of each (build, positions), each build's cost over one position, and
whether the two builds' logits of one probe are the same bits.
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import torch

from core.runtime import native
from core.runtime.exactness import probe_prompt
from core.runtime.forward import target_forward
from core.runtime.target import TargetConfig, load_target
from core.runtime.verify_cost import interleaved_costs
from lab.harness import print_and_save

POSITIONS = (1, 2, 3, 4, 5, 8, 9, 17)


def load_with(flags: tuple[str, ...]):
    """The embedded target in q4 through the native step built with these extra compiler flags."""
    native.CFLAGS = (*native.CFLAGS, *flags)  # another build key: native.load builds (or finds) that build
    target = load_target(TargetConfig(quant="q4"))
    if getattr(target.lean, "native", None) is None:
        raise SystemExit(f"no native step with {flags}: {target.extra.get('native_step')}")
    return target


def commit_step(commit: str, folder: Path):
    """The native step as `commit` wrote core/runtime/csrc/, built (or found built) under its own key."""
    def git(*args: str) -> bytes:
        return subprocess.run(["git", *args], capture_output=True, check=True).stdout

    for name in git("ls-tree", "--name-only", commit, "core/runtime/csrc/").decode().split():
        (folder / Path(name).name).write_bytes(git("show", f"{commit}:{name}"))
    saved = native.CSRC
    native.CSRC = folder  # its headers and include path (native.headers, native._build) are that commit's
    try:
        module, why = native.load(native.Extension(native.LEAN_STEP.name, folder / "lean_step.cpp",
                                                   f"the native decode step of {commit}"))
    finally:
        native.CSRC = saved
    if module is None:
        raise SystemExit(why)
    return module


def load_through(module):
    """The embedded target in q4 through a given build of the native step."""
    saved = native.load
    native.load = lambda ext=None: (module, "") if ext in (None, native.LEAN_STEP) else saved(ext)
    try:
        return load_target(TargetConfig(quant="q4"))
    finally:
        native.load = saved


def same_logits(first, second) -> bool:
    """Whether two targets' logits of a 100-token probe prompt (core.runtime.exactness.probe_prompt) and the 5 positions
    fed
    after it are the same bits."""
    ids = probe_prompt(first.vocab_size, 105)
    logits = []
    with torch.inference_mode():
        for target in (first, second):
            cache = target.new_cache(128)
            logits.append([target_forward(target, part, cache, ())[0] for part in (ids[:100], ids[100:])])
    return all(torch.equal(a, b) for a, b in zip(*logits))


def summary(costs: dict[int, float], module) -> dict:
    return {"activations": module.ACTIVATIONS, "layout": module.LAYOUT, "prefetch_blocks": module.prefetch_blocks(),
            "ms": {n: round(s * 1e3, 3) for n, s in costs.items()},
            "relative_to_one": {n: round(s / costs[1], 3) for n, s in costs.items()}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    other = parser.add_mutually_exclusive_group(required=True)
    other.add_argument("--without", nargs="+", help="instruction sets to turn off (-mno-NAME)")
    other.add_argument("--commit", help="the other build: the step as this commit wrote core/runtime/csrc/")
    parser.add_argument("--cached", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--prefetch", type=int, default=None, help="one prefetch distance for both builds")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    flags = tuple(f"-mno-{name}" for name in args.without or ())
    own = load_with(())
    if args.commit:
        with tempfile.TemporaryDirectory() as folder:
            other = load_through(commit_step(args.commit, Path(folder)))
    else:
        other = load_with(flags)
    if args.prefetch is not None:
        for target in (own, other):
            target.lean.native.set_prefetch_blocks(args.prefetch)
    costs = interleaved_costs({"own": own, "other": other}, args.cached, args.repeats, POSITIONS)
    result = {"cached": args.cached, "repeats": args.repeats, "threads": 2, "other_build_flags": list(flags),
              "other_commit": args.commit, "same_logits": same_logits(own, other),
              "own": summary(costs["own"], own.lean.native), "other": summary(costs["other"], other.lean.native)}
    result["own_over_other"] = {n: round(costs["own"][n] / costs["other"][n], 3) for n in POSITIONS}
    print_and_save(result, args.out)


if __name__ == "__main__":
    main()
