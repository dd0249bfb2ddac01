"""The FlashMap authors' reference loop as the bench's second anchor (`--vs flashmap-reference`): their package's
`FlashMapDraftModel.spec_generate` with the same released-format drafter folder, on the same target and the same
prompt tokens, at the bench's temperature and token budget.

The reference runs as the package runs it: the drafter in fp32 on the target's transformers model in fp32 (its
precision: the reference target loading, core.runtime.target's cpu_precision="reference"), drafting every round the
config's block from noise drawn each round. The package is imported from PyPI (`flashmap`); the folder's own Python
files are never run.
"""
from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from core.runtime.target import Target, TargetConfig, load_target
from core.verification.sampling import SamplingConfig


class ReferenceUnavailable(RuntimeError):
    """The reference loop cannot run here; the message says why."""


@dataclass
class ReferenceRun:
    tokens: list[int]  # new tokens, up to and including a stop token
    seconds: float  # wall time, the prompt's prefill included (as the engine's runs)
    acceptance_lengths: list[int]  # tokens committed by each target forward after the prefill

    @property
    def acceptance(self) -> float | None:
        """Tokens per target forward after the prefill (None: no forward after it)."""
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else None


class FlashMapReference:
    def __init__(self, folder: str | Path, target_cfg: TargetConfig, sampling: SamplingConfig, steps: int = 1):
        try:
            from flashmap import FlashMapDraftModel
        except ImportError as err:
            raise ReferenceUnavailable("the flashmap package is not installed (pip install flashmap==0.1.0)") from err
        if sampling.top_p < 1.0 or sampling.top_k:
            raise ReferenceUnavailable("the reference loop samples from the temperature alone: drop --top-p/--top-k")
        self.target: Target = load_target(replace(target_cfg, cpu_precision="reference", quant="auto",
                                                  dtype="fp32" if target_cfg.device in ("auto", "cpu") else "auto"))
        device = self.target.device
        dtype = torch.float32 if device.type == "cpu" else self.target.model.dtype
        self.draft = FlashMapDraftModel.from_pretrained(str(folder), dtype=dtype).to(device).eval()
        self.sampling, self.steps = sampling, steps
        self.precision = f"drafter {dtype}, target {self.target.precision}"

    def run(self, prompt_ids: list[int], max_new_tokens: int, seed: int = 0) -> ReferenceRun:
        model, device = self.target.model, self.target.device
        ids = torch.tensor([prompt_ids], device=device)
        generator = torch.Generator(device=device).manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the drafter's target_model names the hub id, not the local file
            start = time.perf_counter()
            out = self.draft.spec_generate(model, ids, max_new_tokens=max_new_tokens,
                                           temperature=self.sampling.temperature, num_steps=self.steps,
                                           stop_token_ids=list(self.target.eos_token_ids), generator=generator)
            seconds = time.perf_counter() - start
        tokens = self.target.until_eos(out.sequences[0, len(prompt_ids):].tolist())
        return ReferenceRun(tokens, seconds, list(out.acceptance_lengths))


def acceptance_difference(engine: list[float | None], reference: list[float | None]) -> dict | None:
    """This engine's acceptance length minus the reference's, paired by prompt: {"mean", "se", "prompts"} over the
    prompts where both drafted (None for fewer than two). Replies of different texts accept differently, so the
    standard error says how much of a pooled difference the prompts drawn could give alone."""
    pairs = [a - b for a, b in zip(engine, reference) if a is not None and b is not None]
    if len(pairs) < 2:
        return None
    return {"mean": statistics.mean(pairs), "se": statistics.stdev(pairs) / len(pairs) ** 0.5, "prompts": len(pairs)}


def summary(runs: list[ReferenceRun], plain: list[list[int]], drafted: list[list[int]], plain_tps: float,
            drafter_tps: float, acceptance_length: float | None, greedy: bool, precision: str,
            engine_per_prompt: Sequence[float | None] = ()) -> dict:
    """The reference loop's tokens/s and acceptance length (tokens per target forward) beside this engine's (pooled,
    and paired by prompt where engine_per_prompt gives this engine's per prompt), and how many of its replies equal
    this engine's plain and drafted replies token for token (at T = 0; a different precision may part at a
    near-tie)."""
    tps = sum(len(r.tokens) for r in runs) / sum(r.seconds for r in runs)
    forwards = [n for r in runs for n in r.acceptance_lengths]
    return {"tokens_per_s": tps, "precision": precision, "prompts": len(runs),
            "acceptance_length": sum(forwards) / len(forwards) if forwards else None,
            "engine_acceptance_length": acceptance_length,
            "acceptance_difference": acceptance_difference(list(engine_per_prompt), [r.acceptance for r in runs]),
            "drafter_vs_reference": drafter_tps / tps, "plain_vs_reference": plain_tps / tps,
            "identical_to_plain": sum(r.tokens == p for r, p in zip(runs, plain)) if greedy else None,
            "identical_to_drafted": sum(r.tokens == d for r, d in zip(runs, drafted)) if greedy else None}
