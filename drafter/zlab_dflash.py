"""Published DFlash drafters (z-lab/Qwen3-8B-DFlash-b16 and the same format), loaded natively.

Shape letters: N = context positions, K = block size (anchor + K-1 masked slots), D = drafter width
(= target width), F = len(target_layer_ids) * D, H / H_kv = query / key-value heads, Hd = head dim,
V = target vocabulary.

The format (config.json + safetensors, read directly; no remote code is run): a few Qwen3-style
decoder layers over the block [anchor, mask, ..., mask], whose attention keys and values are the
context positions' projected target features (fc + hidden_norm, then each layer's k_proj/v_proj,
k_norm and RoPE at their absolute positions) followed by the block's own. Attention is not causal.
The target's own embedding and LM head turn ids into inputs and outputs. Because the context keys
and values depend only on the target's features, they are computed once when positions are
committed (`extend`) and kept, like a KV cache that never needs rolling back.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from core.drafting.base import Draft
from core.runtime.modules import ModuleList
from core.verification.sampling import SamplingConfig, sample_rows
from drafter.checkpoint import CheckpointError, load_published_state, read_published

ARCHITECTURE = "DFlashDraftModel"


@dataclass(frozen=True)
class ZLabConfig:
    hidden_size: int
    num_hidden_layers: int  # drafter layers
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]  # target decoder layers; hidden_states index = id + 1
    mask_token_id: int
    vocab_size: int
    attention_bias: bool = False

    @classmethod
    def from_json(cls, data: dict) -> "ZLabConfig":
        if ARCHITECTURE not in data.get("architectures", []):
            raise ValueError(f"architectures is {data.get('architectures')}, not [{ARCHITECTURE!r}]")
        if data.get("rope_scaling"):
            raise ValueError(f"rope_scaling {data['rope_scaling']} is not supported")
        extra = data.get("dflash_config") or {}  # newer files nest these two; older ones keep them on top
        layer_ids = extra.get("target_layer_ids", data.get("target_layer_ids"))
        mask_id = extra.get("mask_token_id", data.get("mask_token_id"))
        if layer_ids is None or mask_id is None:
            raise ValueError("target_layer_ids and mask_token_id are required")
        heads = int(data["num_attention_heads"])
        return cls(
            hidden_size=int(data["hidden_size"]), num_hidden_layers=int(data["num_hidden_layers"]),
            num_attention_heads=heads, num_key_value_heads=int(data.get("num_key_value_heads", heads)),
            head_dim=int(data.get("head_dim") or data["hidden_size"] // heads),
            intermediate_size=int(data["intermediate_size"]), rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            rope_theta=float(data.get("rope_theta", 10000.0)), block_size=int(data["block_size"]),
            num_target_layers=int(data["num_target_layers"]), target_layer_ids=tuple(int(i) for i in layer_ids),
            mask_token_id=int(mask_id), vocab_size=int(data["vocab_size"]),
            attention_bias=bool(data.get("attention_bias", False)),
        )


def assumed_layout(facts, vocab_size: int, layers: int = 5, block_size: int = 16, mask_token_id: int = 0,
                   target_layer_ids: tuple[int, ...] | None = None) -> dict:
    """A published-format config.json at a target's width: for a new drafter of this format, or the plan when the
    real file is not at hand. `layers` Qwen3-style layers reading five target layers spread as the paper's
    1, 9, 17, 25, 33 of 36 unless target_layer_ids are given, block 16 (anchor included). facts: the target's config
    (hidden_size, num_hidden_layers, heads, head_dim, intermediate_size). Every field the published file has is
    written, so that the engines serving this format read it as they read z-lab's."""
    n = facts.num_hidden_layers
    ids = [1 + round(i * (n - 4) / 4) for i in range(5)] if n > 8 else [0, n - 1]  # 36 -> 1, 9, 17, 25, 33
    heads = facts.num_attention_heads
    return {"architectures": [ARCHITECTURE], "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0,
            "block_size": block_size, "dtype": "bfloat16", "hidden_act": "silu", "hidden_size": facts.hidden_size,
            "head_dim": getattr(facts, "head_dim", None) or facts.hidden_size // heads,
            "intermediate_size": facts.intermediate_size, "layer_types": ["full_attention"] * layers,
            "max_position_embeddings": int(getattr(facts, "max_position_embeddings", 8192)),
            "num_attention_heads": heads, "num_hidden_layers": layers,
            "num_key_value_heads": getattr(facts, "num_key_value_heads", None) or heads, "num_target_layers": n,
            "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
            "tie_word_embeddings": False, "use_cache": True, "vocab_size": vocab_size,
            "dflash_config": {"mask_token_id": mask_token_id,
                              "target_layer_ids": list(target_layer_ids) if target_layer_ids else ids}}


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (N, Hd) for absolute positions (N,), halves repeated (the Qwen3 / Llama layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float()[:, None] * inv_freq[None]  # (N, Hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (N, Hd)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (H, N, Hd) rotated by position: x cos + rotate_half(x) sin."""
    first, second = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-second, first], dim=-1) * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: ZLabConfig):
        super().__init__()
        self.c = c
        q_dim, kv_dim = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, q_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, kv_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, kv_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(q_dim, c.hidden_size, bias=c.attention_bias)
        self.q_norm = nn.RMSNorm(c.head_dim, eps=c.rms_norm_eps)
        self.k_norm = nn.RMSNorm(c.head_dim, eps=c.rms_norm_eps)

    def heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        return x.view(x.shape[0], n_heads, self.c.head_dim).transpose(0, 1)  # (N, H*Hd) -> (H, N, Hd)

    def keys_values(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, D) -> rotated keys and values (H_kv, N, Hd) each."""
        k = apply_rope(self.k_norm(self.heads(self.k_proj(x), self.c.num_key_value_heads)), cos, sin)
        return k, self.heads(self.v_proj(x), self.c.num_key_value_heads)

    def forward(self, x: torch.Tensor, cos, sin, ctx_k: torch.Tensor, ctx_v: torch.Tensor) -> torch.Tensor:
        """x (K, D) block; ctx_k, ctx_v (H_kv, N, Hd) -> (K, D). Every slot sees all of context and block."""
        q = apply_rope(self.q_norm(self.heads(self.q_proj(x), self.c.num_attention_heads)), cos, sin)  # (H, K, Hd)
        k, v = self.keys_values(x, cos, sin)  # (H_kv, K, Hd)
        k, v = torch.cat([ctx_k, k], dim=1), torch.cat([ctx_v, v], dim=1)  # (H_kv, N+K, Hd)
        out = F.scaled_dot_product_attention(q[None], k[None], v[None], enable_gqa=True)[0]  # (H, K, Hd)
        return self.o_proj(out.transpose(0, 1).reshape(x.shape[0], -1))  # (K, H*Hd) -> (K, D)


class MLP(nn.Module):
    def __init__(self, c: ZLabConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: ZLabConfig):
        super().__init__()
        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v)
        return x + self.mlp(self.post_attention_layernorm(x))


class ZLabDFlashNet(nn.Module):
    """Parameter names are the checkpoint's tensor names (layers.i.self_attn.q_proj.weight, fc.weight, ...)."""

    def __init__(self, c: ZLabConfig):
        super().__init__()
        self.c = c
        self.layers = ModuleList[Layer](Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """features (N, F) of committed positions (N,) -> per layer keys, values (H_kv, N, Hd)."""
        ctx = self.hidden_norm(self.fc(features))  # (N, D)
        cos, sin = rope(positions, self.c.head_dim, self.c.rope_theta)
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def forward(self, block_embed: torch.Tensor, positions: torch.Tensor, ctx_kv) -> torch.Tensor:
        """block_embed (K, D) at positions (K,), ctx_kv from context_kv -> final hidden states (K, D)."""
        cos, sin = rope(positions, self.c.head_dim, self.c.rope_theta)
        x = block_embed
        for layer, (ctx_k, ctx_v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, ctx_k, ctx_v)
        return self.norm(x)


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


class ZLabDFlashDrafter:
    """The engine's drafter over a published DFlash network: drafts block_size - 1 tokens per pass."""

    def __init__(self, net: ZLabDFlashNet, target):
        self.net, self.c = net, net.c
        self.name = "dflash (published)"
        self.feature_layers = tuple(i + 1 for i in self.c.target_layer_ids)  # hidden_states[0] = embeddings
        self.max_block_size = self.c.block_size - 1  # the anchor takes the block's first position
        self.embed = target.model.get_input_embeddings()
        self.head = target.model.get_output_embeddings()
        self.device = next(net.parameters()).device
        self.ctx_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.n_ctx = 0

    def reset(self) -> None:
        self.ctx_kv, self.n_ctx = [], 0

    @torch.inference_mode()
    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        missing = len(token_ids) - (0 if features is None else features.shape[0])
        if missing:  # positions without features (it reads all, so the engine captures all; a reused prefix may lack
            self.ctx_kv, self.n_ctx = [], self.n_ctx + missing  # them): the context starts again after them
        if features is None:
            return
        dtype = next(self.net.parameters()).dtype
        positions = torch.arange(self.n_ctx, self.n_ctx + features.shape[0], device=self.device)  # (M,)
        new = self.net.context_kv(features.to(self.device, dtype), positions)
        self.ctx_kv = new if not self.ctx_kv else [
            (torch.cat([k, nk], dim=1), torch.cat([v, nv], dim=1)) for (k, v), (nk, nv) in zip(self.ctx_kv, new)]
        self.n_ctx += features.shape[0]

    @torch.inference_mode()
    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        k = min(block_size, self.c.block_size - 1)
        ids = torch.tensor([anchor] + [self.c.mask_token_id] * (self.c.block_size - 1), device=self.device)  # (K,)
        positions = torch.arange(self.n_ctx, self.n_ctx + self.c.block_size, device=self.device)  # anchor first
        hidden = self.net(self.embed(ids), positions, self.ctx_kv)  # (K, D)
        logits = self.head(hidden[1 : 1 + k]).float().cpu()  # (k, V): the slots after the anchor
        confidence, greedy = torch.softmax(logits, dim=-1).max(-1)  # (k,) each: independent of any sampled token
        if sampling.greedy:
            return Draft(greedy, None, confidence)
        q_draft = torch.softmax(logits / sampling.temperature, dim=-1)  # (k, V)
        return Draft(sample_rows(q_draft, generator), q_draft, confidence)
