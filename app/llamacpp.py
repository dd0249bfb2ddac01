"""llama.cpp as the bench's anchor: the same GGUF, the same prompt tokens, thread count and token budget, greedy.

llama-cpp-python is an optional extra (it builds llama.cpp from source, ~8 minutes on 2 cores), not one of the
app's requirements: `bash scripts/install_llamacpp.sh` installs it into .venv with build flags read from this CPU's.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from core.target import EMBEDDED_ID, Target, embedded_gguf_path


class LlamaCppUnavailable(RuntimeError):
    """llama.cpp cannot be run here; the message says why and what to do."""


@dataclass
class LlamaCppRun:
    tokens: int  # new tokens generated
    seconds: float  # wall time, prompt evaluation included (as the engine's runs)
    text: str


WORKER = """
import json, sys, time
from llama_cpp import Llama
model, threads, context = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=context, verbose=False)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    ask = json.loads(line)
    if not ask["reuse"]:  # else llama-cpp-python evaluates only what follows the previous prompt's common prefix
        llm.reset()
    start = time.perf_counter()
    out = llm.create_completion(prompt=ask["ids"], max_tokens=ask["max_tokens"], temperature=0.0)
    seconds = time.perf_counter() - start
    print(json.dumps({"tokens": out["usage"]["completion_tokens"], "seconds": seconds,
                      "text": out["choices"][0]["text"]}), flush=True)
"""


class LlamaCpp:
    """llama.cpp on the target's GGUF file in a process of its own, run greedily on token ids the engine's tokenizer
    made. Its own process keeps it out of this one's thread settings: an OpenMP wait policy set for this engine
    (core.threads) would slow llama.cpp's OpenMP threads too (to a third of their speed, measured), and llama.cpp
    is measured as people run it, with its defaults."""

    def __init__(self, target: Target, threads: int | None = None, context: int = 4096):
        """threads: llama.cpp's threads (default: one per core, as llama.cpp is run)."""
        if target.name != EMBEDDED_ID:
            raise LlamaCppUnavailable(f"--vs llama.cpp needs the target's GGUF file; {target.name!r} is not one "
                                      f"(the embedded {EMBEDDED_ID} is)")
        if importlib.util.find_spec("llama_cpp") is None:
            raise LlamaCppUnavailable("llama-cpp-python is not installed; bash scripts/install_llamacpp.sh")
        self.threads = threads or os.cpu_count() or 1
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(embedded_gguf_path()), str(self.threads),
                                      str(context)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if not self._reply().get("ready"):
            raise LlamaCppUnavailable("llama.cpp did not start")

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise LlamaCppUnavailable(f"llama.cpp's process ended (exit code {self.proc.wait()})")
        return json.loads(line)

    def run(self, prompt_ids: list[int], max_new_tokens: int, reuse: bool = True) -> LlamaCppRun:
        """One greedy reply; reuse: its prompt's prefill starts after what it shares with the previous prompt and
        reply (llama-cpp-python's prefix match; the engine's runs reuse theirs, core.prefix), else from scratch."""
        ask = {"ids": list(prompt_ids), "max_tokens": max_new_tokens, "reuse": reuse}
        self.proc.stdin.write(json.dumps(ask) + "\n")
        self.proc.stdin.flush()
        out = self._reply()
        return LlamaCppRun(int(out["tokens"]), float(out["seconds"]), out["text"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def summary(runs: list[LlamaCppRun], plain_texts: list[str], plain_tps: float, drafter_tps: float,
            threads: int = 0) -> dict:
    """llama.cpp's tokens/s beside this engine's plain and drafted tokens/s, and whether the texts agree (the two
    engines round differently, so greedy texts may part at a near-tie)."""
    tps = sum(r.tokens for r in runs) / sum(r.seconds for r in runs)
    same = sum(r.text.strip() == text.strip() for r, text in zip(runs, plain_texts))
    return {"tokens_per_s": tps, "threads": threads, "texts_identical_to_plain": same, "prompts": len(runs),
            "plain_vs_llama_cpp": plain_tps / tps, "drafter_vs_llama_cpp": drafter_tps / tps}
