"""llama.cpp as the bench's anchor: the same GGUF, the same prompt tokens, thread count and token budget, greedy.

llama-cpp-python is an optional extra (it builds llama.cpp from source, ~8 minutes on 2 cores), not one of the
app's requirements: `bash scripts/install_llamacpp.sh` installs it into .venv with build flags read from this CPU's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from core.target import EMBEDDED_ID, Target, embedded_gguf_path


class LlamaCppUnavailable(RuntimeError):
    """llama.cpp cannot be run here; the message says why and what to do."""


@dataclass
class LlamaCppRun:
    tokens: int  # new tokens generated
    seconds: float  # wall time, prompt evaluation included (as the engine's runs)
    text: str


class LlamaCpp:
    """One llama.cpp model on the target's GGUF file, run greedily on token ids the engine's tokenizer made."""

    def __init__(self, target: Target, threads: int | None = None, context: int = 4096):
        if target.name != EMBEDDED_ID:
            raise LlamaCppUnavailable(f"--vs llama.cpp needs the target's GGUF file; {target.name!r} is not one "
                                      f"(the embedded {EMBEDDED_ID} is)")
        try:
            from llama_cpp import Llama
        except ImportError as err:
            raise LlamaCppUnavailable(f"llama-cpp-python is not installed ({err}); bash scripts/install_llamacpp.sh"
                                      ) from err
        self.threads = threads or torch.get_num_threads()
        self.llm = Llama(model_path=str(embedded_gguf_path()), n_threads=self.threads, n_threads_batch=self.threads,
                         n_ctx=context, verbose=False)

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> LlamaCppRun:
        self.llm.reset()  # no prompt cache carried over from the previous run: every run evaluates its prompt
        start = time.perf_counter()
        out = self.llm.create_completion(prompt=list(prompt_ids), max_tokens=max_new_tokens, temperature=0.0)
        seconds = time.perf_counter() - start
        return LlamaCppRun(int(out["usage"]["completion_tokens"]), seconds, out["choices"][0]["text"])


def summary(runs: list[LlamaCppRun], plain_texts: list[str], plain_tps: float, drafter_tps: float) -> dict:
    """llama.cpp's tokens/s beside this engine's plain and drafted tokens/s, and whether the texts agree (the two
    engines round differently, so greedy texts may part at a near-tie)."""
    tps = sum(r.tokens for r in runs) / sum(r.seconds for r in runs)
    same = sum(r.text.strip() == text.strip() for r, text in zip(runs, plain_texts))
    return {"tokens_per_s": tps, "texts_identical_to_plain": same, "prompts": len(runs),
            "plain_vs_llama_cpp": plain_tps / tps, "drafter_vs_llama_cpp": drafter_tps / tps}
