"""Time to the first token of a long prompt: this engine (the app's defaults) and, when installed, llama.cpp on the same
GGUF and prompt tokens (its own process, its defaults).

python -m scripts.first_token [--tokens 1420] [--repeats 2]
python -m scripts.first_token --turns 5

The prompt is the evaluation code prompts joined into one user message, cut to --tokens; each side runs --repeats
times and the last run is reported (the first warms caches). --turns N: a conversation of N turns (the evaluation
chat prompts, each reply up to 128 tokens); before each turn's reply, the time to its first token with a fresh
prefill and with the previous turn's cache reused (core.decoding.prefix), the two measured back to back.
"""
from __future__ import annotations

import argparse
import time

from app.bench import THREAD_POLICY  # first: the app's thread policy, its wait policy set before torch starts
from core.decoding.engine import GenerationConfig, generate
from core.decoding.prefix import PrefixCache
from core.prompts import read_prompt_file
from core.runtime.target import TargetConfig, load_target
from core.runtime.threads import apply_thread_policy


def long_prompt(target, tokens: int) -> list[int]:
    text = " ".join(row["prompt"] for row in read_prompt_file("eval_code"))
    ids = target.chat_ids([{"role": "user", "content": text}])
    return ids[: tokens - 20] + ids[-20:]  # keep the template's closing tokens


def engine_seconds(target, ids: list[int]) -> float:
    start = time.perf_counter()
    next(iter(generate(target, ids, GenerationConfig(max_new_tokens=2))))
    return time.perf_counter() - start


def conversation_turns(target, turns: int) -> list[tuple[int, float, float]]:
    """(prompt tokens, seconds to the first token with a fresh prefill, with the last turn's cache reused) per turn."""
    messages, prefix, rows = [], PrefixCache(), []
    for prompt in [row["prompt"] for row in read_prompt_file("eval_chat")][:turns]:
        messages.append({"role": "user", "content": prompt})
        ids = target.chat_ids(messages)
        fresh = engine_seconds(target, ids)
        start = time.perf_counter()
        events = generate(target, ids, GenerationConfig(max_new_tokens=128), prefix=prefix)
        reply = list(next(events).committed)
        reused = time.perf_counter() - start
        reply += [token for ev in events for token in ev.committed]
        messages.append({"role": "assistant", "content": target.decode(reply)})
        rows.append((len(ids), fresh, reused))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1420)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turns", type=int, default=0, help="time a conversation's turns instead (see above)")
    args = parser.parse_args(argv)
    threads = apply_thread_policy(THREAD_POLICY[0].threads)
    target = load_target(TargetConfig())
    if args.turns:
        engine_seconds(target, target.chat_ids([{"role": "user", "content": "Hi"}]))  # warm
        print("turn | prompt tokens | first token, fresh prefill (s) | with the last turn's cache (s)")
        for turn, (tokens, fresh, reused) in enumerate(conversation_turns(target, args.turns), 1):
            print(f"{turn} | {tokens} | {fresh:.3f} | {reused:.3f}", flush=True)
        return
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
    runs = [llama.run(ids, 1, reuse=False) for _ in range(args.repeats)]
    llama.close()
    print(f"llama.cpp ({llama.threads} threads): {runs[-1].seconds:.2f} s")


if __name__ == "__main__":
    main()
