"""vLLM's side of scripts/serve_compare.py: plain decoding and DFlash-format drafters on the same prompt ids, T = 0.

Runs with the vLLM environment's Python (scripts/install_vllm.sh makes .venv-vllm; vLLM pins another transformers
than the app, so it lives apart and this script imports nothing of the project):

.venv-vllm/bin/python scripts/vllm_dflash.py --target TARGET_DIR --requests REQ.json --out OUT.json \
    [--drafter EXPORT_DIR ...]

TARGET_DIR: the target as a safetensors folder (`python -m drafter.formats.export --target-out`); each EXPORT_DIR a
folder
written by `python -m drafter.formats.export --format dflash`; REQ.json: {"prompt_ids": [[int, ...], ...],
"max_tokens": N}
(token ids, so that both engines read the same input). vLLM runs plain, then with `{"method": "dflash", "model":
EXPORT_DIR}` for each drafter, one request at a time (a chat user's situation), and writes per run the output token
ids, tokens/s and vLLM's own spec-decode counters (drafts, draft tokens, accepted tokens, accepted per position).
fp32 by default: vLLM's bf16 verify pass rounds unlike its one-token step on the CPU, so bf16 outputs with a
drafter can differ from plain ones (measured: a 12 x 7 prompt forked at its fifth token); fp32 does not.
"""
from __future__ import annotations

import argparse
import json
import time


def spec_counters(llm) -> dict:
    """vLLM's spec-decode counters (vllm:spec_decode_*); per-position acceptance as a list."""
    out: dict = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            key = metric.name.removeprefix("vllm:spec_decode_")
            out[key] = [int(v) for v in metric.values] if hasattr(metric, "values") else int(metric.value)
    return out


def run(llm, prompt_ids: list[list[int]], max_tokens: int) -> dict:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs, tokens, began = [], 0, time.perf_counter()
    for ids in prompt_ids:
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0].outputs[0]
        outputs.append(list(out.token_ids))
        tokens += len(out.token_ids)
    seconds = time.perf_counter() - began
    return {"outputs": outputs, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--requests", required=True)
    parser.add_argument("--drafter", nargs="*", default=[])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from vllm import LLM

    req = json.load(open(args.requests, encoding="utf-8"))
    common = dict(model=args.target, dtype=args.dtype, max_model_len=2048, enforce_eager=True, max_num_seqs=1,
                  disable_log_stats=False)
    runs = {}
    llm = LLM(**common)
    runs["plain"] = run(llm, req["prompt_ids"], req["max_tokens"])
    del llm
    for folder in args.drafter:
        block = json.load(open(f"{folder}/config.json", encoding="utf-8"))["block_size"]
        llm = LLM(**common, speculative_config={"method": "dflash", "model": folder,
                                                "num_speculative_tokens": block - 1})
        result = run(llm, req["prompt_ids"], req["max_tokens"])
        result["spec_decode"] = counters = spec_counters(llm)
        drafts = counters.get("num_drafts", 0)
        # tokens per verify round, the target's own token included: vLLM's "acceptance length"
        result["acceptance_length"] = 1 + counters.get("num_accepted_tokens", 0) / drafts if drafts else None
        runs[folder] = result
        del llm
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"target": args.target, "dtype": args.dtype, "runs": runs}, f)


if __name__ == "__main__":
    main()
