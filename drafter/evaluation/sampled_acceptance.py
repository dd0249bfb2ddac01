"""At T > 0 a FlashMap draft's first slot is accepted with probability sum_v min(p(v), q(v)) (rejection sampling,
core.verification.sampling.verify_sampled): how that acceptance depends on where the flow map's jump starts (x0 = 0,
or x0 drawn from N(0, I) as the paper's sampler does), measured on the same contexts.

python -m drafter.evaluation.sampled_acceptance --prompts eval_math eval_code eval_chat --temperature 1 0.7 [--limit 6]
    [--max-new-tokens 96] [--scales 0 1] [--argmax] [--out FILE.json]

The contexts are the target's own sampled replies (plain decoding at that temperature, seed i for prompt i). At every
position of a reply each scale drafts from the same context, and the target's distribution p there is the one the
reply was sampled from, so each position gives a paired difference between the scales (mean ± standard error).
--argmax adds the first scale's draft proposed deterministically, q's most likely token instead of a draw from q:
accepted with probability p(that token) (verify_sampled with q one-hot), the alternative to sampling from q.

Shape letters: T = positions of a prompt and its reply, V = target vocabulary, F = drafter feature width.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from core.decoding.engine import GenerationConfig, generate
from core.prompts import read_prompt_file
from core.runtime.forward import target_forward
from core.runtime.target import Target, add_target_args, load_target, target_config_from_args
from core.verification.sampling import SamplingConfig, target_probs
from drafter.runtime.drafters import FlowDrafter, load_engine_drafter
from drafter.spec import DrafterSpec


def slot_one_acceptance(target: Target, drafter: FlowDrafter, ids: list[int], start: int, sampling: SamplingConfig,
                        scales: tuple[float, ...], seed: int = 0, argmax: bool = False) -> list[tuple[float, ...]]:
    """For each anchor ids[a], a >= start (the first reply token anchors the engine's first draft): sum_v min(p, q)
    of each scale's first slot, p the target's distribution of the token after the anchor, q the drafter's from the
    positions before it; with argmax, then p(argmax q) of the first scale's q (its most likely token proposed
    deterministically). Every scale draws its noise from a generator seeded alike at each anchor, so scales that
    are equal give equal values. The drafter's own noise scale is left as it was."""
    own_scale = drafter.sampler.noise_scale
    with torch.inference_mode():
        cache = target.new_cache(len(ids))
        logits, features = target_forward(target, ids, cache, drafter.feature_layers)  # (T, V), (T, F)
        p_target = target_probs(logits, sampling)  # (T, V)
        drafter.reset()
        drafter.extend(ids[:start], features[:start])
        rows = []
        for a in range(start, len(ids)):
            row: list[float] = []
            first_q: torch.Tensor | None = None
            for scale in scales:
                drafter.sampler.noise_scale = scale
                draft = drafter.propose(ids[a], 1, sampling, torch.Generator().manual_seed(seed + a))
                drafted = draft.q_draft is not None and len(draft.tokens) > 0
                q_draft = (draft.q_draft[0].to(p_target) if draft.q_draft is not None and drafted
                           else torch.zeros_like(p_target[a]))  # (V,)
                row.append(float(torch.minimum(p_target[a], q_draft).sum()))
                first_q = q_draft if first_q is None else first_q
            if argmax and first_q is not None:  # a deterministic draft of q's most likely token: accepted w.p. p(token)
                row.append(float(p_target[a, first_q.argmax()]) if bool(first_q.any()) else 0.0)
            rows.append(tuple(row))
            drafter.extend([ids[a]], features[a : a + 1])
    drafter.sampler.noise_scale = own_scale
    return rows


def paired(rows: list[tuple[float, ...]], columns: tuple) -> dict:
    """Each column's mean acceptance (a scale, or "argmax") and the first column's paired difference against each
    other one."""
    means = {str(c): statistics.fmean(r[i] for r in rows) for i, c in enumerate(columns)}
    out = {"positions": len(rows), "mean": means}
    for i, column in enumerate(columns[1:], 1):
        diff = [r[0] - r[i] for r in rows]
        se = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else float("nan")
        out[f"{columns[0]} - {column}"] = {"mean": statistics.fmean(diff), "se": se}
    return out


def measure(target: Target, drafter: FlowDrafter, prompts: list[str], temperature: float, max_new_tokens: int,
            scales: tuple[float, ...], argmax: bool = False) -> dict:
    """paired() over the target's sampled replies to these prompts."""
    sampling = SamplingConfig(temperature=temperature)
    rows = []
    for i, prompt in enumerate(prompts):
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        reply = [t for ev in generate(target, ids, GenerationConfig(max_new_tokens, sampling=sampling, seed=i))
                 for t in ev.committed]
        rows += slot_one_acceptance(target, drafter, ids + reply[:-1], len(ids), sampling, scales, seed=i,
                                    argmax=argmax)
    return paired(rows, scales + (("argmax",) if argmax else ()))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", nargs="+", required=True, help="JSONL files or shipped names (eval_math, ...)")
    parser.add_argument("--temperature", type=float, nargs="+", default=[1.0])
    parser.add_argument("--limit", type=int, default=6, help="first N prompts of each file")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--scales", type=float, nargs="+", default=[0.0, 1.0],
                        help="x0's scales to compare, the first against each other one (0: x0 = 0)")
    parser.add_argument("--argmax", action="store_true",
                        help="also the first scale's most likely token proposed deterministically, not drawn from q")
    parser.add_argument("--weights", default=None, help="the FlashMap checkpoint (default: the target's shipped one)")
    parser.add_argument("--out", default=None, help="where the JSON results are written")
    add_target_args(parser)
    args = parser.parse_args(argv)
    if any(t <= 0 for t in args.temperature):
        raise SystemExit("--temperature: only T > 0 samples q (at T = 0 the draft is each slot's argmax)")
    target = load_target(target_config_from_args(args))
    drafter = load_engine_drafter(DrafterSpec("flashmap", weights=args.weights, lookup=False), target)
    results = {"target": target.name, "scales": args.scales, "argmax": args.argmax,
               "max_new_tokens": args.max_new_tokens, "runs": []}
    for name in args.prompts:
        prompts = [row["prompt"] for row in read_prompt_file(name)][: args.limit]
        for temperature in args.temperature:
            run = measure(target, drafter, prompts, temperature, args.max_new_tokens, tuple(args.scales), args.argmax)
            results["runs"].append({"prompts": name, "temperature": temperature, **run})
            print(json.dumps(results["runs"][-1]), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
