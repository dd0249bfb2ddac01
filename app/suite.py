"""Several drafters against one plain-decoding baseline, side by side in one run.

python -m app.suite --prompts FILE.jsonl [FILE ...] [--limit N per file] \
    --variants flashmap,steps=1 flashmap,steps=2 dflash ngram \
    [--block-size 16] [--temperature 0] [--max-new-tokens 128] --out FILE.json

A variant is a drafter spec in its text form (drafter/spec.py): `drafter[,steps=N][,noise=shared|shuffled][,k=K]
[,adaptive=1][,best_of=M][,tree=M][,skip=N][,calibrated=0][,weights=FOLDER]` (k overrides --block-size; unset, each
drafter drafts its own block; adaptive=1 cuts each draft to its best expected length under the verify cost curve
measured at start; best_of=M keeps the most confident of M noise draws; tree=M verifies M drafts together as a
trie of at most k nodes, T=0 only; skip=N caps how many rounds the drafter is skipped after adaptive drafts that did
not pay for its call, 0 = never, default 8; calibrated=0 cuts on the raw confidence; weights picks a checkpoint
other than weights/<target>/<drafter>).
For every prompt, plain decoding and each variant run back to back in an order rotated from prompt to prompt,
so drift on a noisy machine hits all of them alike; each variant's summary has exactly the keys of
`python -m app.bench`, with speedup measured against the same plain runs.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from app import bench
from core.decoding.engine import GenerationConfig
from core.runtime.target import load_target
from core.runtime.verify_cost import cost_curves
from drafter.spec import RunSpec, SpecError


@dataclass(frozen=True, kw_only=True)
class SuiteConfig(bench.RunConfig):
    variants: tuple[str, ...]  # drafter specs as typed: the labels of the results
    specs: tuple[RunSpec, ...]

    def __post_init__(self):
        for spec in self.specs:
            spec.drafter.validate(self.sampling)


def parse_variant(text: str, block_size: int | None = None) -> RunSpec:
    """'flashmap,steps=2,noise=shuffled,k=8' -> RunSpec; --block-size fills k where the text has none."""
    try:
        return RunSpec.parse(text, **({"block_size": block_size} if block_size else {}))
    except SpecError as err:
        raise SystemExit(f"variant {text!r}: {err}") from err


def suite(cfg: SuiteConfig) -> dict:
    target = load_target(cfg.target)
    runners = [bench.make_runner(spec, target, cfg.target.allow_download) for spec in cfg.specs]
    return run_suite(cfg, target, runners)


def run_suite(cfg: SuiteConfig, target, runners: list[bench.Runner]) -> dict:
    """Every runner (one per cfg.variants label) and the plain baseline on each prompt, their order rotated."""
    bench.warm_up(target)
    curves = cost_curves(target) if any(spec.adaptive for spec in cfg.specs) else None
    runners = [r.with_draft_cost(target) for r in runners]
    prompts = [p for path in cfg.prompts for p in bench.read_prompts(path, cfg.limit)]
    base: list = []
    spec: list[list] = [[] for _ in runners]
    plain_prefix = bench.PrefixCache()  # plain decoding's own previous prompt, as each runner has its own
    for i, prompt in enumerate(tqdm(prompts, desc=f"suite x{len(runners)}", unit="prompt")):
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        gen = GenerationConfig(cfg.max_new_tokens, sampling=cfg.sampling, seed=cfg.seed + i)
        curve = curves.for_reply(len(ids), cfg.max_new_tokens) if curves else ()  # the cost after this prompt
        jobs = [(None, lambda g: bench.run_engine(target, ids, g, None, prefix=plain_prefix), gen)] + [
            (j, lambda g, run=r.run: run(ids, g), r.generation(gen, curve)) for j, r in enumerate(runners)]
        shift = i % len(jobs)
        for j, run, job_gen in jobs[shift:] + jobs[:shift]:  # rotate who goes first
            (base if j is None else spec[j]).append(run(job_gen))
    results = [dict(bench.summarize(r, cfg.sampling, target, base, runs), variant=label)
               for label, r, runs in zip(cfg.variants, runners, spec)]
    return {"prompts_files": list(cfg.prompts), "limit": cfg.limit, "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.sampling.temperature, "verify_cost": curves and curves.as_dict(), "results": results}


def parse_args(argv=None) -> tuple[SuiteConfig, str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", required=True, help="drafter specs, e.g. dflash flashmap,steps=2")
    parser.add_argument("--block-size", type=int, default=None,
                        help="K for variants without k= (default and upper limit: each drafter's own block)")
    bench.add_run_args(parser)
    args = parser.parse_args(argv)
    fields = bench.run_fields(args)
    specs = tuple(parse_variant(text, args.block_size) for text in args.variants)
    try:
        cfg = SuiteConfig(variants=tuple(args.variants), specs=specs, **fields)
    except SpecError as err:
        raise SystemExit(str(err)) from err
    return cfg, args.out


def main(argv=None) -> None:
    cfg, out = parse_args(argv)
    result = suite(cfg)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
    for row in result["results"]:
        print(json.dumps({k: row[k] for k in ("variant", "speedup", "acceptance_length", "identical_to_baseline")}))


if __name__ == "__main__":
    main()
