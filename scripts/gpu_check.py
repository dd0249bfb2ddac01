"""GPU check for a lent accelerator: the engine on CUDA with bf16, 8-bit and FP8 weights, on a tiny
random Qwen3 and on SmolLM2-135M (the embedded GGUF re-saved as safetensors so it can be quantised).
Also a tiny random drafter in the published z-lab DFlash format, and the shipped FlashMap drafter on
SmolLM2. Prints one JSON line per run: target, drafter, quant, tokens/s (plain and drafted), identical_to_baseline.

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


def save_zlab(folder: Path, tiny_folder: Path) -> Path:
    """A tiny random drafter in the published z-lab DFlash format for the tiny Qwen3."""
    from tests.test_zlab_dflash import write_zlab, zlab_config, zlab_tensors
    from tests.tiny import make_target
    from transformers import AutoModelForCausalLM

    target = make_target(AutoModelForCausalLM.from_pretrained(tiny_folder))
    cfg = zlab_config(target)
    return write_zlab(folder / "tiny-zlab", cfg, zlab_tensors(cfg))


def drafter_runs(folders: dict[str, Path], zlab: Path) -> list[tuple[str, list[str]]]:
    """(target name, extra bench flags) for the drafters beyond n-gram."""
    return [("tiny-qwen3", ["--drafter", "dflash", "--weights", str(zlab), "--block-size", "3"]),
            ("smollm2-135m-instruct", ["--drafter", "flashmap", "--block-size", "16"]),  # embedded GGUF + shipped weights
            ("smollm2-135m-instruct", ["--drafter", "flashmap", "--block-size", "16", "--tree", "4"])]  # App. D trees


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quants", nargs="+", default=["none", "8bit", "fp8"])
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--prompts", default=str(ROOT.parent / "shared/data/prompts/eval_code.jsonl"))
    args = parser.parse_args()
    from app import bench

    with tempfile.TemporaryDirectory() as tmp:
        folders = save_targets(Path(tmp))
        runs = [(name, ["--drafter", "ngram", "--block-size", "8"]) for name in folders]
        runs += drafter_runs(folders, save_zlab(Path(tmp), folders["tiny-qwen3"]))
        for i, (name, drafter_flags) in enumerate(runs):
            folder = folders.get(name, name)  # the embedded id loads from the wheel (GGUF: no quantisation)
            for quant in args.quants if name in folders else ["none"]:
                out = Path(tmp) / f"{name}-{i}-{quant}.json"
                argv = ["--prompts", args.prompts, "--limit", str(args.limit), *drafter_flags,
                        "--max-new-tokens", "64", "--target", str(folder), "--device",
                        args.device, "--quant", quant, "--dtype", "bf16" if args.device != "cpu" else "fp32",
                        "--out", str(out)]
                try:
                    bench.main(argv)
                    result = json.loads(out.read_text())
                    row = {k: result[k] for k in ("baseline_tokens_per_s", "tokens_per_s", "identical_to_baseline")}
                except Exception as err:  # report and go on: one failing mode must not hide the others
                    row = {"error": f"{type(err).__name__}: {err}"}
                print(json.dumps({"target": name, "drafter": " ".join(drafter_flags[1:]), "device": args.device,
                                  "quant": quant, **row}), flush=True)


if __name__ == "__main__":
    main()
