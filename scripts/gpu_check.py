"""GPU check for a lent accelerator: the engine on CUDA with bf16, 8-bit and FP8 weights, on a tiny
random Qwen3 and on SmolLM2-135M (the embedded GGUF re-saved as safetensors so it can be quantised).
Prints one JSON line per run: target, quant, tokens/s (plain and n-gram), identical_to_baseline.

python scripts/gpu_check.py [--device cuda] [--limit 3]      (CPU smoke test: --device cpu --quants none)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def save_targets(folder: Path) -> dict[str, Path]:
    from app.target import TargetConfig, load_target
    from tests.tiny import QWEN3_TEMPLATE, tiny_qwen3, tiny_tokenizer

    tiny = folder / "tiny-qwen3"
    tiny_qwen3(vocab_size=64).save_pretrained(tiny)
    tiny_tokenizer(64, QWEN3_TEMPLATE).save_pretrained(tiny)
    smol = folder / "smollm2-135m-hf"
    from transformers import AutoModelForCausalLM

    embedded = load_target(TargetConfig(device="cpu"))
    config = embedded.model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF was dequantised on load; save plain weights
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(embedded.model.state_dict())
    plain.generation_config = embedded.model.generation_config
    plain.save_pretrained(smol)
    embedded.tokenizer.save_pretrained(smol)
    return {"tiny-qwen3": tiny, "smollm2-135m": smol}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quants", nargs="+", default=["none", "8bit", "fp8"])
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--prompts", default=str(ROOT.parent / "shared/data/prompts/eval_code.jsonl"))
    args = parser.parse_args()
    from app import bench

    with tempfile.TemporaryDirectory() as tmp:
        for name, folder in save_targets(Path(tmp)).items():
            for quant in args.quants:
                out = Path(tmp) / f"{name}-{quant}.json"
                argv = ["--prompts", args.prompts, "--limit", str(args.limit), "--drafter", "ngram",
                        "--max-new-tokens", "64", "--block-size", "8", "--target", str(folder), "--device",
                        args.device, "--quant", quant, "--dtype", "bf16" if args.device != "cpu" else "fp32",
                        "--out", str(out)]
                try:
                    bench.main(argv)
                    result = json.loads(out.read_text())
                    row = {k: result[k] for k in ("baseline_tokens_per_s", "tokens_per_s", "identical_to_baseline")}
                except Exception as err:  # report and go on: one failing mode must not hide the others
                    row = {"error": f"{type(err).__name__}: {err}"}
                print(json.dumps({"target": name, "device": args.device, "quant": quant, **row}), flush=True)


if __name__ == "__main__":
    main()
