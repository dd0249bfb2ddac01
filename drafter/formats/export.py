"""Export a drafter on the z-lab backbone as a published DFlash folder (config.json + model.safetensors under the
published tensor names), the format vLLM, SGLang and llama.cpp serve with no code of ours.

python -m drafter.formats.export --format dflash WEIGHTS OUT/ [--jump S T] [--tensor-dtype bfloat16|float32]
python -m drafter.formats.export --target-out TARGET_DIR [--target ID]     (the target too, as a safetensors folder)

Shape letters: D = drafter width (= target width), H = query heads, Hd = head dim, I = MLP width.

WEIGHTS is a checkpoint of drafter/networks/zlab_flow.py with `modulation = "scale-gate"`. What is exported is its
draft at
one fixed pair of times: the DFlash-style pass (kind dflash, s = t = 0) or FlashMap's T = 0 draft, the full jump
(0, 1) from x0 = 0 (kind flashmap). There every input the published network does not have is constant:
- the slot input: at s = 0 and x0 = 0 the flow state is h_0 whatever else, so the slots enter as E[mask] (the
  state path state_in(h - h_0) is zero), which is what a published drafter feeds its masked slots;
- each sub-layer's modulation: h = norm(x)(1 + scale) and x + (1 + gate) f(h) with (B, D) constants, so the scale
  multiplies the norm's weight and the gate the rows of the sub-layer's output projection (o_proj, down_proj).
The context path (fc, hidden_norm, each layer's k/v projections of the context) carries no modulation and is
copied as it is. A drafter with shifts (`shift-scale-gate`) is refused: a shift needs a bias the published
layers do not have.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from core.runtime.target import add_target_args, load_target, target_config_from_args
from drafter.config import ZLabFlowConfig
from drafter.formats.checkpoint import CheckpointError, read_checkpoint
from drafter.networks.dflash import ARCHITECTURE, ZLabConfig
from drafter.networks.zlab_flow import ZLabFlowNet

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def draft_times(cfg: ZLabFlowConfig) -> tuple[float, float]:
    """The (s, t) of the drafter's T = 0 draft: DFlash-style's one masked pass, or FlashMap's full jump."""
    return (0.0, 0.0) if cfg.kind == "dflash" else (0.0, 1.0)


@torch.no_grad()
def folded_state(net: ZLabFlowNet, s: float, t: float) -> dict[str, torch.Tensor]:
    """The backbone's tensors with the modulation at (s, t) folded in (fp32), under the published names."""
    if net.cfg.modulation != "scale-gate":
        raise CheckpointError(f"modulation {net.cfg.modulation!r} has shifts, which the published layers cannot "
                              "absorb (no biases); train with --modulation scale-gate to export")
    state = {name: value.detach().float().clone() for name, value in net.backbone.state_dict().items()}
    mods = net.modulations(torch.tensor([s]), torch.tensor([t]), "cpu")
    for i, (attn_mod, mlp_mod) in enumerate(mods):
        p = f"layers.{i}."
        state[p + "input_layernorm.weight"] *= 1 + attn_mod.scale[0]  # (D,)
        state[p + "self_attn.o_proj.weight"] *= (1 + attn_mod.gate[0])[:, None]  # (D, H*Hd): output rows
        state[p + "post_attention_layernorm.weight"] *= 1 + mlp_mod.scale[0]  # (D,)
        state[p + "mlp.down_proj.weight"] *= (1 + mlp_mod.gate[0])[:, None]  # (D, I)
    return state


def export_dflash(weights, out, jump: tuple[float, float] | None = None, dtype: str = "bfloat16") -> Path:
    """Write the published folder for the checkpoint at `weights`; returns `out`. Raises CheckpointError."""
    cfg, state, _vocab_ids, meta = read_checkpoint(weights)
    if not isinstance(cfg, ZLabFlowConfig):
        raise CheckpointError(f"{weights} is a drafter on the project's own network, not on the z-lab DFlash "
                              "backbone: only the latter has the published layout (train with --backbone zlab)")
    ZLabConfig.from_json(cfg.zlab)  # the kept config must still be a published one
    rows = torch.zeros(cfg.draft_vocab, cfg.target_hidden)  # E and the LM head are the target's: not exported
    net = ZLabFlowNet(cfg, rows, rows)
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{weights}: weights do not match the config (missing {missing[:4]}, "
                              f"unexpected {unexpected[:4]})")
    s, t = jump if jump is not None else draft_times(cfg)
    tensors = {k: v.to(DTYPES[dtype]).contiguous() for k, v in folded_state(net.eval(), s, t).items()}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    published = {**cfg.zlab, "architectures": [ARCHITECTURE], "dtype": dtype,
                 "flashmap_export": {"from": str(weights), "kind": cfg.kind, "s": s, "t": t,
                                     "target": meta.get("target"), "step": meta.get("training", {}).get("step")}}
    (out / "config.json").write_text(json.dumps(published, indent=2))
    return out


def export_target(target, out, dtype: str = "float32") -> Path:
    """The loaded target as a transformers folder (config.json, model.safetensors, tokenizer) that vLLM and llama.cpp's
    converter read: the embedded default ships as GGUF only, which transformers dequantizes on load (so the folder
    holds the same weights this project's fp32 engine computes with) but will not save itself."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = target.model
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {name: value.detach().to("cpu", DTYPES[dtype]).clone().contiguous()
             for name, value in model.state_dict().items() if not (tied and name == "lm_head.weight")}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the GGUF's: the folder holds plain tensors
    config["architectures"] = config.get("architectures") or [type(model).__name__]  # GGUF loads leave it empty
    config["torch_dtype"] = config["dtype"] = dtype
    (out / "config.json").write_text(json.dumps(config, indent=2))
    target.tokenizer.save_pretrained(str(out))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", choices=["dflash"], default="dflash", help="the published z-lab DFlash layout")
    parser.add_argument("weights", nargs="?", help="a drafter checkpoint on the z-lab backbone (modulation scale-gate)")
    parser.add_argument("out", nargs="?", help="the folder to write (config.json + model.safetensors)")
    parser.add_argument("--jump", type=float, nargs=2, metavar=("S", "T"), default=None,
                        help="fold the draft at these times (default: 0 0 for DFlash-style, 0 1 for FlashMap)")
    parser.add_argument("--tensor-dtype", choices=sorted(DTYPES), default="bfloat16",
                        help="tensor type written (the published files are bfloat16; float32 keeps the fold exact)")
    parser.add_argument("--target-out", default=None,
                        help="also write the target (--target) as a safetensors folder, in float32, for vLLM and "
                             "llama.cpp's converter")
    add_target_args(parser, cpu_precision="reference")  # the fp32 transformers model: its tensors are saved
    args = parser.parse_args(argv)
    if not args.target_out and not (args.weights and args.out):
        parser.error("give WEIGHTS and OUT, or --target-out")
    if args.weights:
        if not args.out:
            parser.error("OUT is required with WEIGHTS")
        try:
            out = export_dflash(args.weights, args.out, tuple(args.jump) if args.jump else None,
                                args.tensor_dtype)
        except (CheckpointError, ValueError) as err:
            raise SystemExit(f"cannot export {args.weights}: {err}") from err
        print(f"wrote {out}/config.json and {out}/model.safetensors")
    if args.target_out:
        print(f"wrote {export_target(load_target(target_config_from_args(args)), args.target_out)}")


if __name__ == "__main__":
    main()
