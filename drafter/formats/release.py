"""Released FlashMap drafter folders (the `flashmap` 0.1.0 format: config.json with `model_type: "flashmap"` and
model.safetensors), read directly: the folder's Python files are never run. The network is
drafter.networks.release; the engine's drafter over it, drafter.runtime.release.
"""
from __future__ import annotations

import json
import warnings
import weakref
from pathlib import Path
from typing import cast

import torch

from drafter.formats.checkpoint import CheckpointError, load_published_state, read_published
from drafter.networks.release import BASE_PREFIX, MODEL_TYPE, ReleaseConfig, ReleaseNet


def is_release_folder(folder) -> bool:
    try:
        return json.loads((Path(folder) / "config.json").read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def read_release(folder) -> tuple[ReleaseConfig, dict[str, torch.Tensor]]:
    """The config and tensors of a release folder (model.safetensors or an index of shards), or CheckpointError."""
    cfg, state = read_published(folder, ReleaseConfig.from_json, "FlashMap release")
    return cast(ReleaseConfig, cfg), state


def check_target(cfg: ReleaseConfig, target, folder) -> None:
    """Refuse a drafter whose shapes do not fit this target; warn where it was trained for another model (the output
    stays exact, only its drafts are poorer)."""
    model_cfg = target.model.config
    embedding = target.model.get_input_embeddings().weight
    want = (cfg.vocab_size, cfg.target_hidden_size)
    if tuple(embedding.shape) != want:
        raise CheckpointError(f"FlashMap drafter at {folder} was made for a target with vocabulary {want[0]} and "
                              f"width {want[1]} ({cfg.target_model}); {target.name} has {tuple(embedding.shape)}")
    if max(cfg.target_layer_ids) >= model_cfg.num_hidden_layers - 1 or min(cfg.target_layer_ids) < 0:
        raise CheckpointError(f"{folder}: target_layer_ids {list(cfg.target_layer_ids)} need more than "
                              f"{model_cfg.num_hidden_layers} target layers")
    trained_for, loaded = (name.rstrip("/").split("/")[-1].lower() for name in (cfg.target_model, str(target.name)))
    if trained_for and trained_for != loaded:
        warnings.warn(f"the FlashMap drafter at {folder} was trained for {cfg.target_model}, not {target.name}",
                      stacklevel=2)


def without_prefix(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors with `prefix` taken off their names where every name has it: the release's FlashMapDraftModel
    names its base model "flashmap", and a folder saved through a model that wraps it carries that prefix (transformers'
    loader reads both forms)."""
    if state and all(name.startswith(prefix) for name in state):
        return {name[len(prefix):]: tensor for name, tensor in state.items()}
    return state


_NETS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (folder, target) -> its network, while in use


def shared_release_net(folder, target) -> ReleaseNet:
    """load_release_net, once per folder and target while any drafter holds it: the drafters of several step counts
    or noise scales share one copy of the weights (on a GPU, 1 GB for Qwen3-8B's released drafter)."""
    key = (str(Path(folder).resolve()), target.name, str(target.device), id(target))
    net = _NETS.get(key)
    if net is None:
        net = load_release_net(folder, target)
        _NETS[key] = net
    return net


def load_release_net(folder, target, dtype: torch.dtype | None = None) -> ReleaseNet:
    """The release's network for this target, on its device, in `dtype` (default: fp32 on the CPU, where the engine's
    drafter runs in fp32, and the target's floating dtype elsewhere)."""
    cfg, state = read_release(folder)
    check_target(cfg, target, folder)
    net = load_published_state(ReleaseNet(cfg), without_prefix(state, BASE_PREFIX), folder)
    net.requires_grad_(False)  # frozen: a drafter's forward records nothing for autograd, whatever the thread's mode
    if dtype is None:
        weight_dtype = target.model.get_input_embeddings().weight.dtype
        dtype = torch.float32 if target.device.type == "cpu" or not weight_dtype.is_floating_point else weight_dtype
    return cast(ReleaseNet, net.to(device=target.device, dtype=dtype).eval())


