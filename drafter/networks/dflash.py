"""The published DFlash drafter's network (z-lab/Qwen3-8B-DFlash-b16 and the same layout); its folders are read by
drafter.formats.dflash, the engine's drafter over it is drafter.runtime.dflash.

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

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from core.runtime.modules import ModuleList
from drafter.networks.rotary import rotary, rotate_halves

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
        k = rotate_halves(self.k_norm(self.heads(self.k_proj(x), self.c.num_key_value_heads)), cos, sin)
        return k, self.heads(self.v_proj(x), self.c.num_key_value_heads)

    def forward(self, x: torch.Tensor, cos, sin, ctx_k: torch.Tensor, ctx_v: torch.Tensor) -> torch.Tensor:
        """x (K, D) block; ctx_k, ctx_v (H_kv, N, Hd) -> (K, D). Every slot sees all of context and block."""
        q = rotate_halves(self.q_norm(self.heads(self.q_proj(x), self.c.num_attention_heads)), cos, sin)  # (H, K, Hd)
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
        cos, sin = rotary(positions, self.c.head_dim, self.c.rope_theta, "halves")
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def forward(self, block_embed: torch.Tensor, positions: torch.Tensor, ctx_kv) -> torch.Tensor:
        """block_embed (K, D) at positions (K,), ctx_kv from context_kv -> final hidden states (K, D)."""
        cos, sin = rotary(positions, self.c.head_dim, self.c.rope_theta, "halves")
        x = block_embed
        for layer, (ctx_k, ctx_v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, ctx_k, ctx_v)
        return self.norm(x)


