"""Published DFlash drafter folders (z-lab/Qwen3-8B-DFlash-b16 and the same format: config.json with
architectures ["DFlashDraftModel"] and safetensors), read directly; no remote code is run. The network is
drafter.networks.dflash.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import torch

from drafter.formats.checkpoint import CheckpointError, load_published_state, read_published
from drafter.networks.dflash import ARCHITECTURE, ZLabConfig, ZLabDFlashNet


def read_zlab(folder) -> tuple[ZLabConfig, dict[str, torch.Tensor]]:
    """Config and tensors of a z-lab DFlash folder (model.safetensors or an index of shards)."""
    cfg, state = read_published(folder, ZLabConfig.from_json, "DFlash")
    return cast(ZLabConfig, cfg), state


def is_zlab_folder(folder) -> bool:
    try:
        return ARCHITECTURE in json.loads((Path(folder) / "config.json").read_text()).get("architectures", [])
    except (OSError, ValueError, AttributeError):
        return False


def check_target(cfg: ZLabConfig, target, folder) -> None:
    """Refuse a drafter made for another target, with what differs."""
    model_cfg = target.model.config
    want = {"hidden_size": model_cfg.hidden_size, "num_target_layers": model_cfg.num_hidden_layers,
            "vocab_size": target.vocab_size}
    got = {"hidden_size": cfg.hidden_size, "num_target_layers": cfg.num_target_layers, "vocab_size": cfg.vocab_size}
    if got != want:
        raise CheckpointError(f"DFlash drafter at {folder} was made for a target with {got}; the loaded target "
                              f"{target.name} has {want}")
    if max(cfg.target_layer_ids) >= cfg.num_target_layers or cfg.mask_token_id >= target.vocab_size:
        raise CheckpointError(f"{folder}: target_layer_ids or mask_token_id out of range for {target.name}")


def load_zlab_net(folder, target) -> ZLabDFlashNet:
    cfg, state = read_zlab(folder)
    check_target(cfg, target, folder)
    net = load_published_state(ZLabDFlashNet(cfg), state, folder)
    dtype = target.model.get_input_embeddings().weight.dtype
    return cast(ZLabDFlashNet, net.to(device=target.device,
                                      dtype=dtype if dtype.is_floating_point else torch.bfloat16).eval())


