"""Drafter checkpoints: a folder with model.safetensors and config.json (drafter config, the
identity of the target it was trained for, the draft vocabulary, and how it was trained).

Loading refuses, with the reason, a missing, corrupt or mismatched checkpoint. Only safetensors
is read: nothing is unpickled.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from drafter.config import config_from_dict

FORMAT = "flashmap-chat-drafter/1"


class CheckpointError(RuntimeError):
    """A drafter checkpoint cannot be used; the message says why."""


def save_checkpoint(folder, net, vocab_ids: torch.Tensor, target_identity: dict, training: dict) -> None:
    """Trainable weights in bf16 (small repository), frozen E / LM head rows are re-read from the target."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in net.state_dict().items()}
    state["vocab_ids"] = vocab_ids.to("cpu", torch.int64).contiguous()
    save_file(state, str(folder / "model.safetensors"))
    meta = {"format": FORMAT, "drafter": net.cfg.to_dict(), "target": target_identity, "training": training}
    (folder / "config.json").write_text(json.dumps(meta, indent=2))


def read_checkpoint_config(folder, target_identity: dict | None = None, with_meta: bool = False):
    """A checkpoint's drafter config (and its whole config.json with with_meta), checked against the target's
    identity, without reading its weights; CheckpointError says why it cannot serve."""
    folder = Path(folder)
    cfg_path, weights_path = folder / "config.json", folder / "model.safetensors"
    if not cfg_path.is_file() or not weights_path.is_file():
        raise CheckpointError(f"no drafter checkpoint at {folder} (need config.json and model.safetensors)")
    try:
        meta = json.loads(cfg_path.read_text())
        cfg = config_from_dict(meta["drafter"])
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{cfg_path} is not a valid drafter config: {err}") from err
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{cfg_path}: unknown format {meta.get('format')!r}, expected {FORMAT}")
    if target_identity is not None and meta.get("target") != target_identity:
        raise CheckpointError(
            f"drafter at {folder} was trained for target {meta.get('target')}, but the loaded target is "
            f"{target_identity}"
        )
    return (cfg, meta) if with_meta else cfg


def read_checkpoint(folder, target_identity: dict | None = None):
    """Return (config, state dict, vocab_ids, meta) or raise CheckpointError."""
    folder = Path(folder)
    weights_path = folder / "model.safetensors"
    cfg, meta = read_checkpoint_config(folder, target_identity, with_meta=True)
    try:
        state = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{weights_path} is corrupt: {err}") from err
    vocab_ids = state.pop("vocab_ids", None)
    if vocab_ids is None or vocab_ids.shape != (cfg.draft_vocab,):
        raise CheckpointError(f"{weights_path}: draft vocabulary missing or of the wrong size")
    return cfg, {k: v.float() for k, v in state.items()}, vocab_ids, meta


def read_config(folder, parse, what: str):
    """parse(a published drafter folder's config.json), or CheckpointError saying it is not a `what` drafter's."""
    try:
        return parse(json.loads((Path(folder) / "config.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{folder}/config.json is not a {what} drafter config: {err}") from err


def read_published(folder, parse, what: str) -> tuple[object, dict[str, torch.Tensor]]:
    """A published drafter folder (another project's format): parse(its config.json) and every tensor
    (model.safetensors, or the shards its model.safetensors.index.json names), or CheckpointError saying which part
    is not a `what` drafter's."""
    folder = Path(folder)
    cfg = read_config(folder, parse, what)
    index = folder / "model.safetensors.index.json"
    try:
        files = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file()
                 else ["model.safetensors"])
        state = {}
        for name in files:
            state.update(load_file(str(folder / name)))
    except (SafetensorError, OSError, ValueError, KeyError) as err:
        raise CheckpointError(f"{folder}: cannot read the {what} weights: {err}") from err
    return cfg, state


def load_published_state(net: torch.nn.Module, state: dict[str, torch.Tensor], folder) -> torch.nn.Module:
    """net with a published folder's tensors, or CheckpointError naming the ones that do not match its config."""
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{folder}: tensors do not match the config (missing {missing[:4]}, "
                              f"unexpected {unexpected[:4]})")
    return net
