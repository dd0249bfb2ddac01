"""llama.cpp as the bench's anchor: the same GGUF, the same thread count, prompt lengths and reply lengths, greedy.

Two ways to run it, both optional extras built by `bash scripts/install_llamacpp.sh` from the one llama.cpp source
that llama-cpp-python 0.3.36 vendors, with build flags read from this CPU's:
- NativeLlamaCpp, the figure the README's table reports: llama.cpp's own `llama-bench` (in .llamacpp/bin), timing
  each prompt as one test of its prompt length then the plain reply's token count (`-pg P,N`: the prompt evaluated,
  then N tokens generated one by one, llama.cpp's own loop in C++; its tokens' ids do not change its speed);
- LlamaCpp, llama-cpp-python's generate on the same prompt token ids, whose Python loop adds its own per-token cost;
  its figure stands beside the native one with the ratio of the two.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from core.runtime.target import EMBEDDED_ID, Target, embedded_gguf_path

NATIVE_BENCH = Path(__file__).resolve().parent.parent / ".llamacpp" / "bin" / "llama-bench"


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


def gguf_of(target: Target) -> Path:
    """The target's GGUF file, or LlamaCppUnavailable saying why there is none."""
    if target.name != EMBEDDED_ID:
        raise LlamaCppUnavailable(f"--vs llama.cpp needs the target's GGUF file; {target.name!r} is not one "
                                  f"(the embedded {EMBEDDED_ID} is)")
    return embedded_gguf_path()


def own_environment() -> dict:
    """This process's environment without the OpenMP settings made for this engine (core.runtime.threads): llama.cpp
    runs
    with its defaults, as people run it."""
    return {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}


class NativeLlamaCpp:
    """llama.cpp's own binary (llama-bench) on the target's GGUF: seconds(P, N, D) is the time it takes to evaluate a
    P-token prompt and then generate N tokens after D tokens already in its cache (a conversation's earlier turns,
    not timed), after one warm-up run of the same test."""

    def __init__(self, target: Target, threads: int | None = None, binary: Path = NATIVE_BENCH):
        self.gguf = gguf_of(target)
        if not binary.is_file():
            raise LlamaCppUnavailable(f"llama.cpp's own llama-bench is not built ({binary}); bash "
                                      "scripts/install_llamacpp.sh")
        self.binary, self.threads = binary, threads or os.cpu_count() or 1

    def seconds(self, prompt_tokens: int, new_tokens: int, depth: int = 0) -> float:
        command = [str(self.binary), "-m", str(self.gguf), "-t", str(self.threads), "-p", "0", "-n", "0",
                   "-pg", f"{prompt_tokens},{new_tokens}", "-d", str(depth), "-r", "1", "-o", "jsonl"]
        done = subprocess.run(command, capture_output=True, text=True, env=own_environment(), timeout=600)
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or len(rows) != 1:
            raise LlamaCppUnavailable(f"llama-bench failed (exit code {done.returncode}): {done.stderr[-400:]}")
        return rows[0]["avg_ns"] / 1e9


class LlamaCpp:
    """llama.cpp on the target's GGUF file in a process of its own, run greedily on token ids the engine's tokenizer
    made. Its own process keeps it out of this one's thread settings: an OpenMP wait policy set for this engine
    (core.runtime.threads) would slow llama.cpp's OpenMP threads too (to a third of their speed, measured), and
    llama.cpp
    is measured as people run it, with its defaults."""

    def __init__(self, target: Target, threads: int | None = None, context: int = 4096):
        """threads: llama.cpp's threads (default: one per core, as llama.cpp is run)."""
        gguf = gguf_of(target)
        if importlib.util.find_spec("llama_cpp") is None:
            raise LlamaCppUnavailable("llama-cpp-python is not installed; bash scripts/install_llamacpp.sh")
        self.threads = threads or os.cpu_count() or 1
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(gguf), str(self.threads), str(context)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=own_environment())
        assert self.proc.stdin is not None and self.proc.stdout is not None  # (piped)
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        if not self._reply().get("ready"):
            raise LlamaCppUnavailable("llama.cpp did not start")

    def _reply(self) -> dict:
        line = self.stdout.readline()
        if not line:
            raise LlamaCppUnavailable(f"llama.cpp's process ended (exit code {self.proc.wait()})")
        return json.loads(line)

    def run(self, prompt_ids: list[int], max_new_tokens: int, reuse: bool = True) -> LlamaCppRun:
        """One greedy reply; reuse: its prompt's prefill starts after what it shares with the previous prompt and
        reply (llama-cpp-python's prefix match; the engine's runs reuse theirs, core.decoding.prefix), else from
        scratch."""
        ask = {"ids": list(prompt_ids), "max_tokens": max_new_tokens, "reuse": reuse}
        self.stdin.write(json.dumps(ask) + "\n")
        self.stdin.flush()
        out = self._reply()
        return LlamaCppRun(int(out["tokens"]), float(out["seconds"]), out["text"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.stdin.close()
            self.proc.wait(timeout=30)


def summary(native: list[float], new_tokens: list[int], runs: list[LlamaCppRun] | None, plain_texts: list[str],
            plain_tps: float, drafter_tps: float, threads: int = 0) -> dict:
    """llama.cpp's own binary's tokens/s (native: seconds per prompt for new_tokens each) beside this engine's plain and
    drafted tokens/s; with llama-cpp-python's runs, its tokens/s, its ratio to the native figure and whether its texts
    agree with plain decoding's (the two engines round differently, so greedy texts may part at a near-tie)."""
    tps = sum(new_tokens) / sum(native)
    result = {"tokens_per_s": tps, "threads": threads, "prompts": len(native), "binary": "llama-bench",
              "plain_vs_llama_cpp": plain_tps / tps, "drafter_vs_llama_cpp": drafter_tps / tps}
    if runs:
        python_tps = sum(r.tokens for r in runs) / sum(r.seconds for r in runs)
        same = sum(r.text.strip() == text.strip() for r, text in zip(runs, plain_texts))
        result["llama_cpp_python"] = {"tokens_per_s": python_tps, "of_native": python_tps / tps,
                                      "texts_identical_to_plain": same, "prompts": len(runs)}
    return result
