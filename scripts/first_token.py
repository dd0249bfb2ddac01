"""Time to the first token of a long prompt: this engine (the app's defaults) and, when installed, llama.cpp on the same
GGUF and prompt tokens (its own process, its defaults).

python -m scripts.first_token [--tokens 1420] [--repeats 2]

The prompt is the evaluation code prompts joined into one user message, cut to --tokens; each side runs --repeats
times and the last run is reported (the first warms caches).
"""
from __future__ import annotations

import argparse
import time

from app.bench import THREAD_POLICY  # first: the app's thread policy, its wait policy set before torch starts
from core.engine import GenerationConfig, generate
from core.prompts import read_prompt_file
from core.target import TargetConfig, load_target
from core.threads import apply_thread_policy


def long_prompt(target, tokens: int) -> list[int]:
    text = " ".join(row["prompt"] for row in read_prompt_file("eval_code"))
    ids = target.chat_ids([{"role": "user", "content": text}])
    return ids[: tokens - 20] + ids[-20:]  # keep the template's closing tokens


def engine_seconds(target, ids: list[int]) -> float:
    start = time.perf_counter()
    next(iter(generate(target, ids, GenerationConfig(max_new_tokens=2))))
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1420)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    threads = apply_thread_policy(THREAD_POLICY[0].threads)
    target = load_target(TargetConfig())
    ids = long_prompt(target, args.tokens)
    seconds = [engine_seconds(target, ids) for _ in range(args.repeats)][-1]
    print(f"this engine ({target.precision}, {threads} thread(s)): first of {len(ids)} prompt tokens' reply in "
          f"{seconds:.2f} s", flush=True)
    from app.llamacpp import LlamaCpp, LlamaCppUnavailable

    try:
        llama = LlamaCpp(target)
    except LlamaCppUnavailable as err:
        print(f"llama.cpp: {err}")
        return
    runs = [llama.run(ids, 1) for _ in range(args.repeats)]
    llama.close()
    print(f"llama.cpp ({llama.threads} threads): {runs[-1].seconds:.2f} s")


if __name__ == "__main__":
    main()
