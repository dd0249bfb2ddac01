"""Benchmark CLI: plain decoding against a drafter, prompt by prompt, alternating, same settings.

python -m app.bench --prompts FILE.jsonl [--limit N] --drafter NAME [--steps 1|2] [--block-size K]
    [--temperature T] [--max-new-tokens N] [--target ID] [--seed S] --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from app.engine import GenerationConfig, RoundEvent, generate
from app.prompts import read_jsonl
from app.registry import ENGINE_DRAFTERS, HF_BASELINES, build_drafter
from app.sampling import SamplingConfig
from app.stats import AcceptanceStats
from app.target import Target, add_target_args, load_target, target_config_from_args
from app.verify_cost import relative_curve


def read_prompts(path: str, limit: int | None) -> list[str]:
    prompts = [row["prompt"] for row in read_jsonl(path)]
    return prompts[:limit] if limit else prompts


@dataclass
class Run:
    """One generation's output and cost, from the engine's events or from transformers' generate."""

    tokens: list[int]
    seconds: float
    events: list[RoundEvent] = field(default_factory=list)


def run_engine(target: Target, prompt_ids: list[int], gen: GenerationConfig, drafter) -> Run:
    start = time.perf_counter()
    events = list(generate(target, prompt_ids, gen, drafter))
    seconds = time.perf_counter() - start
    return Run([t for ev in events for t in ev.committed], seconds, events)


def run_hf(target: Target, prompt_ids: list[int], gen: GenerationConfig, prompt_lookup: bool) -> Run:
    """transformers' own generate (optionally with prompt-lookup assisted generation), same settings."""
    s = gen.sampling
    kwargs = dict(max_new_tokens=gen.max_new_tokens, do_sample=not s.greedy, eos_token_id=list(target.eos_token_ids))
    if not s.greedy:
        kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
    if prompt_lookup:
        kwargs.update(prompt_lookup_num_tokens=gen.block_size)
    torch.manual_seed(gen.seed)
    input_ids = torch.tensor([prompt_ids], device=target.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    seconds = time.perf_counter() - start
    return Run(target.until_eos(out[0, len(prompt_ids):].tolist()), seconds)


def summarize(args, target: Target, base: list[Run], spec: list[Run]) -> dict:
    stats = AcceptanceStats()
    for run in spec:
        stats.add_all(run.events)
    base_tokens, spec_tokens = sum(len(r.tokens) for r in base), sum(len(r.tokens) for r in spec)
    base_tps = base_tokens / sum(r.seconds for r in base)
    spec_tps = spec_tokens / sum(r.seconds for r in spec)
    greedy = args.temperature == 0
    return {
        "target": target.name,
        "drafter": args.drafter,
        "steps": args.steps,
        "noise": args.noise,
        "block_size": args.block_size,
        "adaptive": args.adaptive,
        "best_of": args.best_of,
        "tree": args.tree,
        "max_skip": args.max_skip,
        "temperature": args.temperature,
        "prompts": len(spec),
        "new_tokens": spec_tokens,
        "baseline_tokens_per_s": base_tps,
        "tokens_per_s": spec_tps,
        "speedup": spec_tps / base_tps,
        "acceptance_length": stats.acceptance_length,
        "per_slot_acceptance": stats.per_slot(args.block_size) if stats.rounds else None,
        "rounds": stats.rounds,  # with the counts below, runs pool exactly (docs/benchmarks.md)
        "per_slot_reached": stats.reached[: args.block_size],
        "per_slot_accepted": stats.accepted[: args.block_size],
        "identical_to_baseline": all(b.tokens == s.tokens for b, s in zip(base, spec)) if greedy else None,
        "per_prompt": [
            {"baseline_tokens": len(b.tokens), "baseline_s": b.seconds, "tokens": len(s.tokens), "s": s.seconds,
             "identical": b.tokens == s.tokens}
            for b, s in zip(base, spec)
        ],
    }


def tree_refusal(drafter: str, tree: int, temperature: float) -> str | None:
    """Why a tree of `tree` drafts per round cannot run with these settings (None: it can). Checked before the
    target loads; the drafter and the engine refuse the same cases again for any other caller."""
    if tree > 1 and temperature > 0:
        return "several drafts are verified together exactly at temperature 0 only"
    if tree > 1 and drafter not in ("flashmap", "flashmap-teacher"):
        return "a tree needs a flow drafter (flashmap, flashmap-teacher): the others draw no noise"
    return None


def make_runner(args, target: Target):
    """Return run(prompt_ids, gen) for the chosen drafter; the baseline is always the engine with none."""
    if args.drafter in HF_BASELINES:
        lookup = args.drafter == "hf-prompt-lookup"
        return lambda ids, gen: run_hf(target, ids, gen, lookup)
    drafter = build_drafter(args.drafter, target, steps=args.steps, weights=args.weights,
                            allow_download=args.allow_download, best_of=args.best_of, tree=args.tree)
    if args.noise == "shuffled":
        if not hasattr(drafter, "sampler"):
            raise SystemExit(f"--noise shuffled needs a flow drafter, not {args.drafter}")
        drafter.sampler.shared_noise = False
    return lambda ids, gen: run_engine(target, ids, gen, drafter)


def warm_up(target: Target) -> None:
    """One short generation first, so one-time costs (allocations, kernel choice) hit no measured run."""
    warm = target.chat_ids([{"role": "user", "content": "Hi"}])
    run_engine(target, warm, GenerationConfig(max_new_tokens=8), None)


def bench(args) -> dict:
    target = load_target(target_config_from_args(args))
    prompts = read_prompts(args.prompts, args.limit)
    run_drafter = make_runner(args, target)
    sampling = SamplingConfig(args.temperature, args.top_p, args.top_k)
    warm_up(target)
    curve = relative_curve(target) if args.adaptive else ()
    base, spec = [], []
    for i, prompt in enumerate(tqdm(prompts, desc=f"bench {args.drafter}", unit="prompt")):
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        gen = GenerationConfig(args.max_new_tokens, args.block_size, sampling, seed=args.seed + i, verify_cost=curve,
                               max_skip=args.max_skip)
        if i % 2 == 0:  # alternate the order so drift on a noisy machine hits both sides alike
            base.append(run_engine(target, ids, gen, None))
            spec.append(run_drafter(ids, gen))
        else:
            spec.append(run_drafter(ids, gen))
            base.append(run_engine(target, ids, gen, None))
    return summarize(args, target, base, spec)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", required=True, help="JSONL with a `prompt` field per line")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--drafter", required=True, choices=ENGINE_DRAFTERS + HF_BASELINES)
    parser.add_argument("--steps", type=int, default=1, help="FlashMap jumps (1 or 2; teacher: Euler steps, e.g. 16)")
    parser.add_argument("--noise", default="shared", choices=["shared", "shuffled"],
                        help="shuffled: independent noise per slot (the shuffle test, paper §6.2)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--best-of", type=int, default=1,
                        help="flow drafters: draft M blocks from independent noise, keep the most confident")
    parser.add_argument("--tree", type=int, default=1,
                        help="flow drafters, T=0: draft M blocks from independent noise and verify them together "
                             "as a trie of at most --block-size nodes (paper App. D)")
    parser.add_argument("--adaptive", action="store_true",
                        help="cut each draft to its best expected length under this machine's verify cost curve")
    parser.add_argument("--max-skip", type=int, default=8,
                        help="with --adaptive: skip the drafter for up to N rounds after empty drafts (0: never)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weights", default=None, help="drafter checkpoint folder or hub id (default: weights/<target>/<drafter>)")
    parser.add_argument("--out", required=True)
    add_target_args(parser)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.steps < 1 or args.best_of < 1 or args.tree < 1 or args.max_skip < 0:
        raise SystemExit("--steps, --best-of and --tree must be >= 1, --max-skip >= 0")
    if why := tree_refusal(args.drafter, args.tree, args.temperature):
        raise SystemExit(f"--tree {args.tree}: {why}")
    result = bench(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "per_prompt"}))


if __name__ == "__main__":
    main()
