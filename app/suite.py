"""Several drafters against one plain-decoding baseline, side by side in one run.

python -m app.suite --prompts FILE.jsonl [FILE ...] [--limit N per file] --variants flashmap,steps=1 flashmap,steps=2 dflash ngram \
    [--block-size 16] [--temperature 0] [--max-new-tokens 128] --out FILE.json

A variant is `drafter[,steps=N][,noise=shared|shuffled][,k=K][,adaptive=1][,best_of=M][,tree=M][,weights=FOLDER]`
(k overrides --block-size; adaptive=1 cuts each draft to its best expected length under the verify cost curve
measured at start; best_of=M keeps the most confident of M noise draws; tree=M verifies M drafts together as a
trie of at most k nodes, T=0 only; skip=N caps how many rounds the drafter is skipped after empty adaptive drafts,
0 = never, default 8; weights picks a checkpoint other than weights/<target>/<drafter>).
For every prompt, plain decoding and each variant run back to back in an order rotated from prompt to prompt,
so drift on a noisy machine hits all of them alike; each variant's summary has exactly the keys of
`python -m app.bench`, with speedup measured against the same plain runs.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from app import bench
from app.engine import GenerationConfig
from app.registry import ENGINE_DRAFTERS, HF_BASELINES
from app.sampling import SamplingConfig
from app.target import add_target_args, load_target, target_config_from_args
from app.verify_cost import relative_curve


def parse_variant(spec: str, defaults: argparse.Namespace) -> argparse.Namespace:
    """'flashmap,steps=2,noise=shuffled,k=8' -> the bench's per-drafter arguments."""
    name, *options = spec.split(",")
    if name not in ENGINE_DRAFTERS + HF_BASELINES:
        raise SystemExit(f"unknown drafter {name!r} in variant {spec!r}")
    fields = {"drafter": name, "steps": 1, "noise": "shared", "block_size": defaults.block_size, "adaptive": False,
              "best_of": 1, "tree": 1, "max_skip": 8, "weights": None}
    for option in options:
        key, _, value = option.partition("=")
        if key not in ("steps", "noise", "k", "adaptive", "best_of", "tree", "skip", "weights") or not value:
            raise SystemExit(f"variant {spec!r}: options are steps=N, noise=shared|shuffled, k=K, adaptive=1, "
                             "best_of=M, tree=M, skip=N, weights=FOLDER")
        field = {"k": "block_size", "skip": "max_skip"}.get(key, key)
        fields[field] = value if key in ("noise", "weights") else int(value)
    fields["adaptive"] = bool(fields["adaptive"])
    if why := bench.tree_refusal(name, fields["tree"], defaults.temperature):
        raise SystemExit(f"variant {spec!r}: {why}")
    variant = argparse.Namespace(**{**vars(defaults), **fields})
    variant.label = spec
    return variant


def suite(args) -> dict:
    target = load_target(target_config_from_args(args))
    variants = [parse_variant(spec, args) for spec in args.variants]
    runners = [bench.make_runner(v, target) for v in variants]
    sampling = SamplingConfig(args.temperature, args.top_p, args.top_k)
    bench.warm_up(target)
    curve = relative_curve(target) if any(v.adaptive for v in variants) else ()
    prompts = [p for path in args.prompts for p in bench.read_prompts(path, args.limit)]
    base, spec = [], [[] for _ in variants]
    for i, prompt in enumerate(tqdm(prompts, desc=f"suite x{len(variants)}", unit="prompt")):
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        gen = GenerationConfig(args.max_new_tokens, args.block_size, sampling, seed=args.seed + i)
        jobs = [(None, lambda g: bench.run_engine(target, ids, g, None), gen)] + [
            (j, lambda g, run=run: run(ids, g),
             replace(gen, block_size=v.block_size, verify_cost=curve if v.adaptive else (), max_skip=v.max_skip))
            for j, (v, run) in enumerate(zip(variants, runners))]
        shift = i % len(jobs)
        for j, run, job_gen in jobs[shift:] + jobs[:shift]:  # rotate who goes first
            (base if j is None else spec[j]).append(run(job_gen))
    results = []
    for v, runs in zip(variants, spec):
        results.append(dict(bench.summarize(v, target, base, runs), variant=v.label))
    return {"prompts_files": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "verify_cost": curve, "results": results}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", nargs="+", required=True, help="JSONL files with a `prompt` field")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts of each file")
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    add_target_args(parser)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    result = suite(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    for row in result["results"]:
        print(json.dumps({k: row[k] for k in ("variant", "speedup", "acceptance_length", "identical_to_baseline")}))


if __name__ == "__main__":
    main()
