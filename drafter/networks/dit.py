"""The drafter network: a conditional DiT over the K slots of a block (paper §3.1).

Shape letters: B = batch of blocks, K = slots, C = context positions (window + anchor),
F = concatenated target features (len(feature_layers) * D_t), D_t = target width,
D = drafter width, V = draft vocabulary, H = heads.

Each block: bidirectional self-attention among slots (QK-norm), cross-attention to the context,
and a GELU MLP, each modulated by adaLN-Zero on the time pair (s, t). The state enters through the
target's frozen embedding rows E (V, D_t) and leaves through its frozen LM head rows W (V, D_t).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from core.runtime.modules import ModuleList
from drafter.config import DrafterConfig, ZLabFlowConfig
from drafter.flow import posterior


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of t in [0, 1]. t (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device) / half)  # (dim/2,)
    angles = 1000.0 * t.float()[:, None] * freqs[None]  # (B, dim/2): t scaled like a diffusion step index
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


@dataclass(frozen=True)
class PooledContext:
    """Training's context of B blocks, kept factored: blocks drawn from one sequence read mostly the same
    positions, so the cross-attention's key and value maps project each pool position once per step instead of
    once per block that reads it (the context was a large share of a DFlash-style training step; figures:
    docs/journal/engine.md, scripts/profile_train.py). The gathered
    tensor it stands for is (pool[window] | anchor) + pos, (B, W+1, D)."""

    pool: torch.Tensor  # (P, D) ctx_in of every position some block reads
    window: torch.Tensor  # (B, W) pool row of each context position, right-aligned before the anchor
    anchor: torch.Tensor  # (B, D) anchor_in of each block's anchor token
    pos: torch.Tensor  # (W+1, D) position embedding by distance to the anchor

    def __getitem__(self, rows) -> "PooledContext":
        return PooledContext(self.pool, self.window[rows], self.anchor[rows], self.pos)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.window.shape[0], self.window.shape[1] + 1, self.pool.shape[1]  # (B, W+1, D)

    @property
    def device(self) -> torch.device:
        return self.pool.device

    def gathered(self) -> torch.Tensor:
        return torch.cat([self.pool[self.window], self.anchor[:, None]], dim=1) + self.pos  # (B, W+1, D)

    def linear(self, layer: nn.Linear) -> torch.Tensor:
        """layer(gathered()) with the pool projected once: W (c + p) + b = (W c)[window] | W a, plus W p + b."""
        body = F.linear(self.pool, layer.weight)[self.window]  # (P, D') gathered -> (B, W, D')
        anchor = F.linear(self.anchor, layer.weight)[:, None]  # (B, 1, D')
        return torch.cat([body, anchor], dim=1) + layer(self.pos)  # (B, W+1, D')


def project(layer: nn.Linear, src) -> torch.Tensor:
    """layer(src) for a context tensor; a factored context (PooledContext, frozen.CachedContext) computes it itself."""
    return layer(src) if isinstance(src, torch.Tensor) else src.linear(layer)


class Attention(nn.Module):
    """Multi-head attention with QK-norm; self-attention when context is None."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.q_norm, self.k_norm = nn.RMSNorm(dim // heads), nn.RMSNorm(dim // heads)

    def forward(self, x: torch.Tensor, context=None, mask: torch.Tensor | None = None):
        """x (B, K, D); context None (self-attention), a (B, C, D) tensor or a PooledContext; mask (B, C)."""
        src = x if context is None else context
        b, n, d = x.shape

        def split(y):
            return y.view(b, y.shape[1], self.heads, d // self.heads).transpose(1, 2)  # (B, N, D) -> (B, H, N, D/H)

        q, k, v = self.q_norm(split(self.q(x))), self.k_norm(split(project(self.k, src))), split(project(self.v, src))
        attn_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, C) True = attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, H, K, D/H)
        return self.o(out.transpose(1, 2).reshape(b, n, d))  # (B, K, D)


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(dim, elementwise_affine=False) for _ in range(3))
        self.self_attn, self.cross_attn = Attention(dim, heads), Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))
        self.ada = nn.Linear(dim, 9 * dim)  # shift, scale, gate for each of the three sub-layers
        nn.init.zeros_(self.ada.weight)  # adaLN-Zero: every block starts as the identity
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, cond, context, context_mask):
        return self.run(x, self.modulations(cond), context, context_mask)

    def modulations(self, cond: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """adaLN-Zero's shift, scale and gate of each sub-layer from the time conditioning. cond (B, D) -> 9 x (B, D)"""
        return self.ada(F.silu(cond)).chunk(9, dim=-1)

    def run(self, x, mods, context, context_mask):
        """The block given its modulations (drafting at fixed times computes them once, drafter/runtime/frozen.py)."""
        h = modulate(self.norms[0](x), mods[0], mods[1])
        x = x + mods[2][:, None] * self.self_attn(h)
        h = modulate(self.norms[1](x), mods[3], mods[4])
        x = x + mods[5][:, None] * self.cross_attn(h, context, context_mask)
        h = modulate(self.norms[2](x), mods[6], mods[7])
        return x + mods[8][:, None] * self.mlp(h)


class FlowNet(nn.Module):
    """What every drafter network shares: the flow state enters through the target's embedding rows E (V, D_t)
    (App. A, eq. 9) and logits leave through its LM head rows. Subclasses give embed_matrix, head_matrix,
    matrix_sources (the tensors those are built from) and forward(slot_input, s, t, context, context_mask)."""

    cfg: DrafterConfig | ZLabFlowConfig
    state_norm: nn.RMSNorm
    raw_norm: nn.RMSNorm
    _frozen: dict[str, tuple[tuple, torch.Tensor]]
    ctx_in: Callable[[torch.Tensor], torch.Tensor]  # target features (..., F) -> context states (..., D)

    def context_projected(self, ctx: torch.Tensor, mask: torch.Tensor,
                          anchor_embed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ctx (B, W, D) after ctx_in, mask (B, W), anchor_embed (B, D_t) -> context (B, W+1, D), mask (B, W+1)."""
        raise NotImplementedError

    def masked_input(self, batch: int) -> torch.Tensor:
        """The slot inputs (B, K, D_t) of a fully masked block (the one-pass DFlash-style draft)."""
        raise NotImplementedError

    def start_from_mask(self) -> None:
        """Make a DFlash-style net's one pass the flow's t = 0 pass (a teacher warm-started from it)."""
        raise NotImplementedError

    def embed_matrix(self) -> torch.Tensor:
        """E's rows for the draft vocabulary (V, D_t)."""
        raise NotImplementedError

    def head_matrix(self) -> torch.Tensor:
        """The LM head's rows for the draft vocabulary (V, D_t)."""
        raise NotImplementedError

    def matrix_sources(self) -> tuple[torch.Tensor, ...]:
        """The tensors embed_matrix and head_matrix are built from (a change to any rebuilds them)."""
        raise NotImplementedError

    def state_input(self, x: torch.Tensor, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """h = RMSNorm(pi_s(x) E) + (t - s) RMSNorm(x E) (App. A, eq. 9). x (B, K, V) -> (B, K, D_t).

        The (t - s) factor multiplies the normalised raw path, so the student equals the teacher's
        posterior-only input on the diagonal s = t (the paper normalises each term; we scale after).
        """
        embed = self.embed_matrix()  # (V, D_t)
        h = self.state_norm(posterior(x, s) @ embed)  # (B, K, D_t)
        return h + (t - s).view(-1, 1, 1) * self.raw_norm(x @ embed)

    def noise_input(self, x0_embed: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """state_input for a jump from s = 0 to t given only x0 E (B, K, D_t): pi_0 is uniform, so
        pi_0 E = mean(E), and the raw path is t * RMSNorm(x0 E)."""
        return self.start_state().expand_as(x0_embed) + t.view(-1, 1, 1) * self.raw_norm(x0_embed)

    def start_state(self) -> torch.Tensor:
        """RMSNorm(mean(E)) (D_t,): the state input of every slot at s = t = 0, whatever the noise."""
        return self.state_norm(self._cached("embed_mean", lambda: self.embed_matrix().mean(0)))

    def probs(self, slot_input, s, t, context, context_mask) -> torch.Tensor:
        """The per-slot distribution on the simplex (softmax of forward, in fp32). -> (B, K, V)"""
        return torch.softmax(self(slot_input, s, t, context, context_mask).float(), dim=-1)

    def _cached(self, name: str, build) -> torch.Tensor:
        """build() once per parameter state when no gradient is wanted: drafting rebuilt the (V, D_t)
        matrices on every proposal (a tenth of its time). Any in-place update (optimizer step, load) bumps
        a tensor's version and a move changes its storage, so the copy is rebuilt then."""
        if torch.is_grad_enabled():
            return build()
        key = tuple((p._version, p.data_ptr()) for p in self.matrix_sources())
        hit = self._frozen.get(name)
        if hit is None or hit[0] != key:
            hit = self._frozen[name] = (key, build())
        return hit[1]


class DraftNet(FlowNet):
    """Maps slot inputs (B, K, D_t), times (s, t) and target context to per-slot logits (B, K, V)."""

    cfg: DrafterConfig
    embed_rows: torch.Tensor  # (V, D_t) buffers, registered in __init__
    head_rows: torch.Tensor

    def __init__(self, cfg: DrafterConfig, embed_rows: torch.Tensor, head_rows: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        self._frozen: dict[str, tuple[tuple, torch.Tensor]] = {}  # inference copies, see _cached
        self.grad_checkpoint = False  # training option (drafter.training.train --grad-checkpoint), not a config field
        d, dt = cfg.d_model, cfg.target_hidden
        # frozen copies of the target's E and LM head rows for the draft vocabulary (V, D_t); row 0 is
        # the "other" class (every token outside the draft vocabulary) and is learned instead
        self.register_buffer("embed_rows", embed_rows.float(), persistent=False)
        self.register_buffer("head_rows", head_rows.float(), persistent=False)
        self.other_embed = nn.Parameter(embed_rows.float().mean(0).clone())
        self.other_head = nn.Parameter(torch.zeros(dt))
        self.state_norm, self.raw_norm = nn.RMSNorm(dt), nn.RMSNorm(dt)  # App. A: each path normalised
        self.mask_embed = nn.Parameter(torch.zeros(dt))  # DFlash-style input of a masked slot
        self.slot_in = nn.Linear(dt, d)
        self.slot_pos = nn.Parameter(torch.randn(cfg.block_size, d) * 0.02)
        self.ctx_in = nn.Sequential(nn.Linear(len(cfg.feature_layers) * dt, d), nn.RMSNorm(d))
        self.anchor_in = nn.Sequential(nn.Linear(dt, d), nn.RMSNorm(d))
        self.ctx_pos = nn.Parameter(torch.randn(cfg.context_window + 1, d) * 0.02)  # by distance to anchor
        self.time_mlp = nn.Sequential(nn.Linear(2 * d, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = ModuleList[DiTBlock](DiTBlock(d, cfg.n_heads, cfg.mlp_ratio) for _ in range(cfg.n_layers))
        self.out_norm = nn.LayerNorm(d, elementwise_affine=False)
        self.out_ada = nn.Linear(d, 2 * d)
        nn.init.zeros_(self.out_ada.weight)
        nn.init.zeros_(self.out_ada.bias)
        self.out = nn.Linear(d, dt)

    def start_from_mask(self) -> None:
        """Make a DFlash-style net's one pass the flow's t = 0 pass: shift slot_in's bias by W (mask_embed -
        start_state), so the flow's t = 0 input (start_state, whatever the noise) reaches the first layer exactly
        where the mask embedding did. Both passes condition on (0, 0), so a flow teacher warm-started this way
        begins with the DFlash-style net's t = 0 acceptance (without it the warm start lost 0.04)."""
        with torch.no_grad():
            offset = self.mask_embed.detach() - self.start_state()  # (D_t,)
            self.slot_in.bias.add_(self.slot_in.weight @ offset)  # (D,)

    def masked_input(self, batch: int) -> torch.Tensor:
        return self.mask_embed.expand(batch, self.cfg.block_size, -1)  # (B, K, D_t)

    def context(self, features: torch.Tensor, mask: torch.Tensor, anchor: torch.Tensor, anchor_embed: torch.Tensor):
        """features (B, W, F) right-aligned before the anchor, mask (B, W) -> context (B, W+1, D), mask (B, W+1)."""
        return self.context_projected(self.ctx_in(features), mask, anchor_embed)

    def context_projected(self, ctx: torch.Tensor, mask: torch.Tensor,
                          anchor_embed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context() after ctx_in: training and the engine project each position once and reuse it.
        ctx (B, W, D), mask (B, W), anchor_embed (B, D_t) -> context (B, W+1, D), mask (B, W+1)."""
        anchor_tok = self.anchor_in(anchor_embed)[:, None]  # (B, 1, D)
        ctx = torch.cat([ctx, anchor_tok], dim=1) + self.ctx_pos[-ctx.shape[1] - 1 :]  # (B, W+1, D)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # (B, W+1)
        return ctx, mask

    def context_pooled(self, pool: torch.Tensor, window: torch.Tensor, mask: torch.Tensor, anchor_embed: torch.Tensor):
        """context_projected kept factored for training (PooledContext). pool (P, D) after ctx_in, window (B, W),
        mask (B, W), anchor_embed (B, D_t) -> PooledContext standing for (B, W+1, D), mask (B, W+1)."""
        pos = self.ctx_pos[-window.shape[1] - 1 :]  # (W+1, D)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # (B, W+1)
        return PooledContext(pool, window, self.anchor_in(anchor_embed), pos), mask

    def forward(self, slot_input, s, t, context, context_mask) -> torch.Tensor:
        """slot_input (B, K, D_t), s, t (B,), context (B, C, D) or PooledContext, mask (B, C) -> logits (B, K, V)."""
        return self.trunk(slot_input, self.conditioning(s, t), context, context_mask) @ self.head_matrix().T

    def conditioning(self, s: torch.Tensor, t: torch.Tensor) -> tuple[list, tuple[torch.Tensor, torch.Tensor]]:
        """Everything the time pair decides: each block's modulations and the output's shift and scale.
        s, t (B,) -> ([9 x (B, D)] per block, ((B, D), (B, D)))"""
        d = self.cfg.d_model
        cond = self.time_mlp(torch.cat([time_embedding(s, d), time_embedding(t, d)], dim=-1))  # (B, D)
        return [block.modulations(cond) for block in self.blocks], self.out_ada(F.silu(cond)).chunk(2, dim=-1)

    def trunk(self, slot_input, conditioning, context, context_mask) -> torch.Tensor:
        """The blocks and the output projection, before the LM head rows. -> (B, K, D_t)"""
        block_mods, (shift, scale) = conditioning
        x = self.slot_in(slot_input) + self.slot_pos[: slot_input.shape[1]]  # (B, K, D)
        for block, mods in zip(self.blocks, block_mods):
            if self.grad_checkpoint and self.training:  # recompute activations in backward (large V, big D)
                x = checkpoint(block.run, x, mods, context, context_mask, use_reentrant=False)
            else:
                x = block.run(x, mods, context, context_mask)
        return self.out(modulate(self.out_norm(x), shift, scale))  # (B, K, D_t)

    def embed_matrix(self) -> torch.Tensor:
        return self._cached("embed", lambda: torch.cat([self.other_embed[None], self.embed_rows[1:]]))  # (V, D_t)

    def head_matrix(self) -> torch.Tensor:
        return self._cached("head", lambda: torch.cat([self.other_head[None], self.head_rows[1:]]))  # (V, D_t)

    def matrix_sources(self) -> tuple[torch.Tensor, ...]:
        return self.other_embed, self.other_head, self.embed_rows, self.head_rows
