"""A FlashMap drafter whose backbone is a published z-lab DFlash network: warm-started from it, a
Qwen3-8B flow teacher starts where DFlash already is instead of from nothing (the paper's teacher cost ~25 h x
32 H200s).

Shape letters: B = blocks, K = drafted slots (the published block minus its anchor), W = context window,
F = feature width (len(target_layer_ids) * D), D = drafter width = target width, V = target vocabulary,
H / H_kv = query / key-value heads, Hd = head dim, Dc = width of the time conditioning.

What is added to the DFlash network, each starting as the identity so that at initialisation the flow
network at t = 0 *is* the published drafter (tests/test_zlab_flow.py checks the logits):
- the flow state h (eq. 9, built by FlowNet.state_input) enters where DFlash's mask embedding does, through a
  zero-initialised linear map and offset by the t = 0 state: slot input = E[mask] + A (h - h_0). At s = t = 0
  every slot's state is h_0 whatever the noise, so the input is exactly the mask embedding there, always.
- each layer's two sub-layers are modulated by (s, t) as in adaLN, h = norm(x)(1 + scale) + shift and
  x + (1 + gate) f(h), with shift, scale, gate from a zero-initialised linear map of the time conditioning.
  With `modulation = "scale-gate"` there is no shift: at a fixed (s, t) the scale is then a factor on the norm's
  weight and the gate one on the output projection's rows, so the drafter at that (s, t) is a published DFlash
  network with other weights (drafter/formats/export.py). A shift is not foldable: the published attention and MLP
  have no biases, and a bias before k_norm would also move the context's keys.
Times are fed as tau(s), tau(t) (eq. 6): equal steps of decoding progress, so t = 0 and the early times the
samplers use are spread apart instead of crowded near 0.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from core.runtime.modules import ModuleList
from drafter.config import MODULATIONS, ZLabFlowConfig
from drafter.flow import tau_of_t
from drafter.networks.dflash import ZLabConfig, ZLabDFlashNet
from drafter.networks.dit import FlowNet, time_embedding
from drafter.networks.rotary import rotary, rotate_halves


class ZLabFlowNet(FlowNet):
    """FlowNet over a z-lab DFlash backbone (parameters under backbone.* keep the published tensor names)."""

    cfg: ZLabFlowConfig
    embed_rows: torch.Tensor  # buffers, registered in __init__
    head_rows: torch.Tensor
    mask_embed: torch.Tensor

    def __init__(self, cfg: ZLabFlowConfig, embed_rows: torch.Tensor, head_rows: torch.Tensor):
        super().__init__()
        self.cfg, self.zc = cfg, ZLabConfig.from_json(cfg.zlab)
        self._frozen: dict[str, tuple[tuple, torch.Tensor]] = {}
        self.grad_checkpoint = False
        d, layers = self.zc.hidden_size, self.zc.num_hidden_layers
        self.register_buffer("embed_rows", embed_rows.float(), persistent=False)  # (V, D) frozen, the target's E
        self.register_buffer("head_rows", head_rows.float(), persistent=False)  # (V, D) its LM head
        self.register_buffer("mask_embed", embed_rows[self.zc.mask_token_id].float().clone(), persistent=False)
        self.backbone = ZLabDFlashNet(self.zc)
        self.state_norm, self.raw_norm = nn.RMSNorm(d), nn.RMSNorm(d)
        self.state_in = nn.Linear(d, d, bias=False)
        self.time_mlp = nn.Sequential(nn.Linear(2 * cfg.d_cond, cfg.d_cond), nn.SiLU())
        # per layer, for attention and MLP each: (shift,) scale, gate
        self.ada = ModuleList[nn.Linear](nn.Linear(cfg.d_cond, 2 * len(MODULATIONS[cfg.modulation]) * d)
                                 for _ in range(layers))
        for layer in (self.state_in, *self.ada):
            nn.init.zeros_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    @classmethod
    def from_zlab(cls, zlab: dict, state: dict[str, torch.Tensor], embed_rows, head_rows,
                  context_window: int = 256, modulation: str = "scale-gate") -> "ZLabFlowNet":
        """The flow network warm-started from a published drafter: its config.json as read and its tensors, which
        load into the backbone. Its modulation is the foldable one unless asked otherwise, so that what it learns
        exports back to the published format (drafter/formats/export.py). ValueError where the tensors do not
        fit the config."""
        cfg = ZLabFlowConfig(zlab=zlab, context_window=context_window, modulation=modulation)
        net = cls(cfg, embed_rows, head_rows)
        missing, unexpected = net.backbone.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        if missing or unexpected:
            raise ValueError(f"tensors do not match the config (missing {missing[:4]}, "
                                  f"unexpected {unexpected[:4]})")
        return net

    def start_from_mask(self) -> None:
        """A DFlash-style net on this backbone already is the flow's t = 0 pass: its slots enter as E[mask] through
        state_in(h_0 - h_0) = 0, and both condition on (0, 0). Nothing to move (DraftNet's one shifts a bias)."""

    # ---- the FlowNet interface ----------------------------------------------------------------------------
    def ctx_in(self, features: torch.Tensor) -> torch.Tensor:
        """Target features (..., F) -> the backbone's context states (..., D), once per position."""
        return self.backbone.hidden_norm(self.backbone.fc(features))

    def context_projected(self, ctx: torch.Tensor, mask: torch.Tensor,
                          anchor_embed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ctx (B, W, D), mask (B, W), anchor_embed (B, D) -> (B, W+1, D), (B, W+1): the anchor rides as the last
        row and becomes the block's first position in forward, as DFlash places it."""
        ctx = torch.cat([ctx, anchor_embed[:, None].to(ctx.dtype)], dim=1)  # (B, W+1, D)
        return ctx, torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)

    def masked_input(self, batch: int) -> torch.Tensor:
        """The state whose slot input is E[mask]: DFlash's own input, for one masked pass."""
        return self.start_state().expand(batch, self.cfg.block_size, -1)  # (B, K, D)

    def embed_matrix(self) -> torch.Tensor:
        return self.embed_rows  # (V, D)

    def head_matrix(self) -> torch.Tensor:
        return self.head_rows  # (V, D)

    def matrix_sources(self) -> tuple[torch.Tensor, ...]:
        return self.embed_rows, self.head_rows

    def forward(self, slot_input, s, t, context, context_mask) -> torch.Tensor:
        """slot_input (B, K, D) flow state, s, t (B,), context (B, W+1, D) with the anchor last, mask (B, W+1)
        -> logits (B, K, V) of the K slots after the anchor."""
        ctx, anchor = context[:, :-1], context[:, -1:]  # (B, W, D), (B, 1, D)
        x = self.mask_embed + self.state_in(slot_input - self.start_state())  # (B, K, D): E[mask] at t = 0
        x = torch.cat([anchor, x.to(anchor.dtype)], dim=1)  # (B, 1+K, D)
        w, n = ctx.shape[1], x.shape[1]
        positions = torch.arange(w + n, device=x.device)  # (W+1+K,)
        cos, sin = rotary(positions, self.zc.head_dim, self.zc.rope_theta, "halves")  # (W+1+K, Hd)
        attend = torch.cat([context_mask[:, :-1], torch.ones_like(context_mask[:, :1]).expand(-1, n)], 1)  # (B, W+n)
        for layer, mods in zip(self.backbone.layers, self.modulations(s, t, x.device)):
            args = (layer, mods, x, ctx, attend, cos, sin)
            x = checkpoint(modulated_layer, *args, use_reentrant=False) if self.grad_checkpoint and self.training \
                else modulated_layer(*args)
        hidden = self.backbone.norm(x)[:, 1:]  # (B, K, D), a strided slice
        b, k, d = hidden.shape
        # one (B*K, D) x (D, V) product: on the strided 3-d slice torch ran a batched product per block, half as fast
        # (0.75 s against 0.36 s for 480 rows over SmolLM2's 49,152 tokens, one thread)
        logits = hidden.reshape(b * k, d) @ self.head_matrix().T.to(hidden.dtype)  # (B*K, V)
        return logits.view(b, k, -1)  # (B, K, V)

    def modulations(self, s: torch.Tensor, t: torch.Tensor, device) -> list[tuple["SubLayerMod", "SubLayerMod"]]:
        """Per backbone layer, the (attention, MLP) modulation at times s, t (B,), fed as tau(s), tau(t) (eq. 6)."""
        vocab, d_cond = self.cfg.draft_vocab, self.cfg.d_cond
        times = torch.cat([time_embedding(tau_of_t(s.float().cpu(), vocab).to(device), d_cond),
                           time_embedding(tau_of_t(t.float().cpu(), vocab).to(device), d_cond)], -1)  # (B, 2Dc)
        cond = F.silu(self.time_mlp(times))  # (B, Dc)
        names = MODULATIONS[self.cfg.modulation]
        out = []
        for ada in self.ada:
            parts = dict(zip([f"{n}{i}" for i in (1, 2) for n in names], ada(cond).chunk(2 * len(names), -1)))
            attention, mlp = (SubLayerMod(parts.get(f"shift{i}"), parts[f"scale{i}"], parts[f"gate{i}"])
                              for i in (1, 2))  # each part (B, D)
            out.append((attention, mlp))
        return out


class SubLayerMod(NamedTuple):
    """A sub-layer's time modulation (B, D) each: h = norm(x)(1 + scale) + shift, x + (1 + gate) f(h)."""
    shift: torch.Tensor | None  # None: the foldable scale-gate design
    scale: torch.Tensor
    gate: torch.Tensor

    def input(self, normed: torch.Tensor) -> torch.Tensor:
        h = normed * (1 + self.scale[:, None])  # (B, n, D)
        return h if self.shift is None else h + self.shift[:, None]

    def output(self, out: torch.Tensor) -> torch.Tensor:
        return (1 + self.gate[:, None]) * out  # (B, n, D)


def modulated_layer(layer, mods: tuple[SubLayerMod, SubLayerMod], x, ctx, attend, cos, sin) -> torch.Tensor:
    """One backbone decoder layer with its time modulation. x (B, n, D), ctx (B, W, D)."""
    attn_mod, mlp_mod = mods
    h = attn_mod.input(layer.input_layernorm(x))
    x = x + attn_mod.output(batched_attention(layer.self_attn, h, ctx, attend, cos, sin))
    return x + mlp_mod.output(layer.mlp(mlp_mod.input(layer.post_attention_layernorm(x))))


def batched_attention(attn, x, ctx, attend, cos, sin) -> torch.Tensor:
    """The backbone's attention for a batch: block x (B, n, D) attends to its context ctx (B, W, D), whose keys
    and values come from the same projections, and to itself; not causal. attend (B, W+n) True = visible."""
    c = attn.c
    b, n, _ = x.shape
    w = ctx.shape[1]

    def heads(y, count):
        return y.view(b, y.shape[1], count, c.head_dim).transpose(1, 2)  # (B, N, H*Hd) -> (B, H, N, Hd)

    q = rotate_halves(attn.q_norm(heads(attn.q_proj(x), c.num_attention_heads)), cos[w:], sin[w:])  # (B, H, n, Hd)
    src = torch.cat([ctx, x], dim=1)  # (B, W+n, D)
    k = rotate_halves(attn.k_norm(heads(attn.k_proj(src), c.num_key_value_heads)), cos, sin)  # (B, H_kv, W+n, Hd)
    v = heads(attn.v_proj(src), c.num_key_value_heads)  # (B, H_kv, W+n, Hd)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attend[:, None, None, :], enable_gqa=True)  # (B,H,n,Hd)
    return attn.o_proj(out.transpose(1, 2).reshape(b, n, -1))  # (B, n, H*Hd) -> (B, n, D)
