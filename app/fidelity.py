"""How faithful each precision of the engine is to an independent reference: transformers in fp32 on the same GGUF
file (its dequantised weights), with llama.cpp on the same file beside it.

For each prompt the reference writes its greedy reply; then every forward under test reads the prompt and that reply
as plain decoding would (the prompt in one prefill, then the reply one token a step), and at each reply position its
greedy token is compared with the reference's. Reported per precision: the share of positions where the two agree,
the KL divergence of the forward's next-token distribution from the reference's (median and mean), and at each
disagreement the reference's margin, its top logit minus its logit of the token the forward chose: how near a tie
the reference itself was there. Teacher forcing keeps every position comparable (a free-running reply that parts
once would compare different texts after it).

python -m app.fidelity --prompts heldout_math heldout_code heldout_chat --limit 8 --precisions q4 bf16 fp32 \
    --vs llama.cpp --out docs/results/engine/fidelity.json

Shape letters: N = reply positions, V = vocabulary.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.llamacpp import own_environment
from core.prompts import read_prompt_file
from core.runtime.target import EMBEDDED_ID, Target, TargetConfig, embedded_gguf_path, load_target
from core.runtime.threads import apply_thread_policy

# what each precision asks the loader for; the reference is transformers' own fp32 forward with torch's linears
PRECISIONS: dict[str, dict[str, Any]] = {"q4": {"quant": "q4"}, "bf16": {"dtype": "bf16", "quant": "none"},
              "fp32": {"dtype": "fp32", "quant": "none"}}
REFERENCE: dict[str, Any] = {"dtype": "fp32", "quant": "none", "engine": "transformers", "cpu_linear": "torch"}


@dataclass(frozen=True)
class Case:
    """One prompt and the reference's greedy reply to it, with the reference's logits at the reply's positions."""

    prompt_ids: list[int]
    reply: list[int]  # (N,) the reference's greedy tokens
    logits: torch.Tensor  # (N, V) fp32: the reference's, each position predicting reply[i]


def reference_case(reference: Target, prompt_ids: list[int], max_new_tokens: int) -> Case:
    """The reference's greedy reply (until its end-of-sequence token, kept) and its logits over it in one forward."""
    ids = torch.tensor([prompt_ids])  # (1, P)
    with torch.inference_mode():
        out = reference.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                       do_sample=False, eos_token_id=list(reference.eos_token_ids))
        reply = out[0, len(prompt_ids):].tolist()
        seq = torch.tensor([prompt_ids + reply[:-1]])  # (1, P + N - 1)
        logits = reference.model(input_ids=seq).logits[0, len(prompt_ids) - 1:].float()  # (N, V)
    return Case(list(prompt_ids), reply, logits)


def engine_logits(target: Target, case: Case) -> torch.Tensor:
    """The target's logits at the reply's positions as plain decoding computes them: the prompt in one prefill,
    then the reference's reply fed one token a step. Returns (N, V) fp32."""
    from core.runtime.forward import target_forward

    cache = target.new_cache(len(case.prompt_ids) + len(case.reply) + 1)
    rows = []
    with torch.inference_mode():
        logits, _ = target_forward(target, case.prompt_ids, cache, (), keep=1)
        rows.append(logits[-1].float())
        for token in case.reply[:-1]:
            logits, _ = target_forward(target, [token], cache, ())
            rows.append(logits[-1].float())
    return torch.stack(rows)  # (N, V)


def compare(reference: torch.Tensor, logits: torch.Tensor) -> dict:
    """reference, logits (N, V) -> per position: whether the greedy tokens agree, KL(reference || logits), and at
    each disagreement the reference's top logit minus its logit of the token `logits` chose."""
    ours = logits.argmax(-1)  # (N,)
    theirs = reference.argmax(-1)  # (N,)
    log_p, log_q = reference.log_softmax(-1), logits.log_softmax(-1)  # (N, V) each
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # (N,)
    differ = (ours != theirs).nonzero().flatten()
    margins = (reference[differ, theirs[differ]] - reference[differ, ours[differ]]).tolist()
    return {"positions": len(ours), "agree": int((ours == theirs).sum()), "kl": kl.clamp_min(0).tolist(),
            "margins": margins}


def pooled(rows: list[dict]) -> dict:
    """The prompts' comparisons pooled: agreement over all positions, KL's median and mean, the margins."""
    kl = [k for row in rows for k in row["kl"]]
    margins = sorted((m for row in rows for m in row["margins"]), reverse=True)
    positions = sum(row["positions"] for row in rows)
    return {"prompts": len(rows), "positions": positions,
            "agreement": sum(row["agree"] for row in rows) / positions,
            "prompts_agreeing_everywhere": sum(row["agree"] == row["positions"] for row in rows),
            "kl_median": statistics.median(kl), "kl_mean": statistics.fmean(kl),
            "disagreements": len(margins), "margin_max": margins[0] if margins else 0.0,
            "margin_median": statistics.median(margins) if margins else 0.0,
            "margins_over_half_a_logit": sum(m > 0.5 for m in margins)}


LLAMA_WORKER = """
import sys, numpy as np
from llama_cpp import Llama
model, threads, context, tokens, prompt_len, out = sys.argv[1:7]
llm = Llama(model_path=model, n_threads=int(threads), n_ctx=int(context), logits_all=True, verbose=False)
ids = [int(t) for t in tokens.split(",")]
llm.eval(ids)
np.save(out, np.asarray(llm.scores[int(prompt_len) - 1:len(ids)], dtype=np.float32))
"""


def llama_cpp_logits(case: Case, threads: int) -> torch.Tensor:
    """llama.cpp's logits (llama-cpp-python, its own process) at the reply's positions, over the same tokens."""
    seq = case.prompt_ids + case.reply[:-1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.npy"
        subprocess.run([sys.executable, "-c", LLAMA_WORKER, str(embedded_gguf_path()), str(threads),
                        str(len(seq) + 8), ",".join(map(str, seq)), str(len(case.prompt_ids)), str(out)],
                       check=True, env=own_environment())
        return torch.from_numpy(np.load(out))  # (N, V)


@dataclass(frozen=True)
class FidelityConfig:
    prompts: tuple[str, ...]
    precisions: tuple[str, ...] = ("q4", "bf16", "fp32")
    limit: int | None = None
    max_new_tokens: int = 128
    llama_cpp: bool = False  # also llama.cpp (llama-cpp-python) on the same file
    target: TargetConfig = TargetConfig()

    def __post_init__(self):
        unknown = set(self.precisions) - set(PRECISIONS)
        if unknown:
            raise ValueError(f"precisions must be among {sorted(PRECISIONS)}, got {sorted(unknown)}")
        if self.llama_cpp and self.target.target != EMBEDDED_ID:
            raise ValueError(f"llama.cpp reads the embedded target's GGUF file; {self.target.target!r} has none")


def fidelity(cfg: FidelityConfig) -> dict:
    """Every precision (and llama.cpp) against the reference on the same prompts; results pooled and per prompt."""
    threads = apply_thread_policy(0)
    reference = load_target(replace(cfg.target, **REFERENCE))
    prompts = [row["prompt"] for name in cfg.prompts for row in read_prompt_file(name)[:cfg.limit]]
    cases = [reference_case(reference, reference.chat_ids([{"role": "user", "content": p}]), cfg.max_new_tokens)
             for p in prompts]
    del reference
    precisions: dict[str, dict] = {}
    result = {"prompts": list(cfg.prompts), "limit": cfg.limit, "max_new_tokens": cfg.max_new_tokens,
              "reference": "transformers fp32 (dequantised GGUF, torch linears)", "precisions": precisions}
    for name in cfg.precisions:
        target = load_target(replace(cfg.target, **PRECISIONS[name]))
        rows = [compare(case.logits, engine_logits(target, case)) for case in cases]
        precisions[name] = {"forward": target.precision, **pooled(rows), "per_prompt": slim(rows)}
        del target
    if cfg.llama_cpp:
        rows = [compare(case.logits, llama_cpp_logits(case, threads)) for case in cases]
        precisions["llama.cpp"] = {"forward": "llama.cpp (llama-cpp-python), the GGUF's own kernels",
                                             **pooled(rows), "per_prompt": slim(rows)}
    return result


def slim(rows: list[dict]) -> list[dict]:
    """Per prompt without the per-position KL list: agreement, positions, KL's median and the margins."""
    return [{"positions": r["positions"], "agree": r["agree"], "kl_median": statistics.median(r["kl"]),
             "margins": [round(m, 4) for m in r["margins"]]} for r in rows]


def parse_args(argv=None) -> tuple[FidelityConfig, str]:
    from core.runtime.target import add_target_args, target_config_from_args

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", nargs="+", required=True, help="JSONL files or shipped names (heldout_math, ...)")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts of each file")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="the reference's reply length at most")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    parser.add_argument("--vs", choices=["llama.cpp"], default=None,
                        help="also llama.cpp on the same GGUF (llama-cpp-python: bash scripts/install_llamacpp.sh)")
    parser.add_argument("--out", required=True, help="where the JSON results are written")
    add_target_args(parser)
    args = parser.parse_args(argv)
    try:
        cfg = FidelityConfig(tuple(args.prompts), tuple(args.precisions), args.limit, args.max_new_tokens,
                             args.vs == "llama.cpp", target_config_from_args(args))
    except ValueError as err:
        raise SystemExit(str(err)) from err
    return cfg, args.out


def main(argv=None) -> None:
    cfg, out = parse_args(argv)
    result = fidelity(cfg)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1))
    for name, row in result["precisions"].items():
        print(f"{name:10s} agreement {row['agreement']:.4f}  KL median {row['kl_median']:.2e} mean "
              f"{row['kl_mean']:.2e}  disagreements {row['disagreements']}, reference margin max "
              f"{row['margin_max']:.3f}  ({row['forward']})")


if __name__ == "__main__":
    main()
