"""A training or evaluation batch: target context and the K clean tokens after each anchor.

Shape letters: B = blocks, K = slots, W = context window, P = pooled positions, F = feature width,
D = drafter width, D_t = target width. `drafter.data` produces them; the losses and the evaluator read them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from drafter.networks.dit import DraftNet, FlowNet
from drafter.networks.release import ReleaseNet
from drafter.networks.rotary import rotary, rotate_pairs


@dataclass
class Blocks:
    """Training blocks: target context and the K clean tokens after each anchor.

    The context is stored once per position (`pool`, P rows) and each block reads its window of it
    through `window`: blocks drawn from the same sequence share positions, so each network projects a
    position once per step instead of once per block that sees it.
    """

    pool: torch.Tensor  # (P, F) target features of every position some block reads
    window: torch.Tensor  # (B, W) pool row of each context position, right-aligned before the anchor
    feature_mask: torch.Tensor  # (B, W) True where a context position exists (window is 0 elsewhere)
    anchors: torch.Tensor  # (B,) anchor token ids (target vocabulary)
    anchor_embed: torch.Tensor  # (B, D_t) the target's embedding of each anchor
    tokens: torch.Tensor  # (B, K) draft-vocabulary ids of the clean block (0 = other)
    valid: torch.Tensor  # (B, K) False past the end of the response

    @classmethod
    def from_windows(cls, features: torch.Tensor, feature_mask, anchors, anchor_embed, tokens, valid) -> "Blocks":
        """Blocks from per-block windows (B, W, F) that share nothing."""
        b, w, f = features.shape
        return cls(features.reshape(b * w, f), torch.arange(b * w).view(b, w), feature_mask, anchors,
                   anchor_embed, tokens, valid)

    @property
    def features(self) -> torch.Tensor:
        return self.pool[self.window]  # (B, W, F)

    def to(self, device) -> "Blocks":
        return Blocks(*(getattr(self, f.name).to(device) for f in fields(self)))

    def context(self, net: FlowNet, rows: torch.Tensor | None = None, pooled: bool = False):
        """The network's context (B, W+1, D) and mask for all blocks, or for the blocks in `rows`. pooled: kept
        factored (network.PooledContext) where the network can read it so, as training does."""
        window, mask, anchor_embed = self.window, self.feature_mask, self.anchor_embed
        if rows is not None:
            window, mask, anchor_embed = window[rows], mask[rows], anchor_embed[rows]
        projected = net.ctx_in(self.pool)  # (P, D): each position once
        if pooled and isinstance(net, DraftNet):  # (the project's network reads a pooled context)
            return net.context_pooled(projected, window, mask, anchor_embed)
        return net.context_projected(projected[window], mask, anchor_embed)  # (B, W, D) gathered


def block_context(net: ReleaseNet, blocks: Blocks) -> tuple[list, torch.Tensor]:
    """Per layer keys, values (B, H, W + 1, Hd) of each block's window and its anchor, and the mask (B, 1, 1, W + 1).
    Positions are the window's own (0..W - 1, the anchor at W): RoPE reads only their differences."""
    b, w = blocks.window.shape
    rope_ctx = rotary(torch.arange(w), net.c.head_dim, net.c.rope_theta, "pairs")
    rope_anchor = rotary(torch.tensor([w]), net.c.head_dim, net.c.rope_theta, "pairs")
    pooled = net.norm("hidden_norm", net.fc(blocks.pool))  # (P, D): each position once
    anchor = net.norm("anchor_norm", net.anchor_proj(blocks.anchor_embed))[:, None]  # (B, 1, D)
    rows = blocks.window.flatten()  # (B * W,) gathered with index_select, whose backward adds rows in place

    def gather(x: torch.Tensor) -> torch.Tensor:  # (P, H, Hd) -> (B, W, H, Hd)
        return x.flatten(1).index_select(0, rows).view(b, w, *x.shape[1:])

    context = []
    for layer in net.layers:
        keys, values = layer.cross_attn.unrotated_keys_values(pooled)  # (P, H, Hd)
        keys = rotate_pairs(gather(keys), *rope_ctx).transpose(-3, -2)  # (B, H, W, Hd)
        values = gather(values).transpose(-3, -2)
        anchor_keys, anchor_values = layer.cross_attn.keys_values(anchor, rope_anchor)  # (B, H, 1, Hd)
        context.append((torch.cat([keys, anchor_keys], 2), torch.cat([values, anchor_values], 2)))
    mask = torch.cat([blocks.feature_mask, torch.ones(b, 1, dtype=torch.bool)], 1)[:, None, None]
    return context, mask
