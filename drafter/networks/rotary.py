"""Rotary position embeddings (RoPE) for the drafters' attention, written once, in the two layouts their checkpoints
were trained with: "pairs" rotates each interleaved channel pair (x[2i], x[2i + 1]) by its angle (the released FlashMap
drafter, drafter.networks.release), "halves" rotates x[i] with x[i + Hd/2] (Qwen3's and Llama's rotate-half, the
published DFlash drafter, drafter.networks.dflash). The target's own rotary is core.runtime.lean's; the project's
DiT (drafter.networks.dit) learns its positions instead.

Channel pair i turns by position * theta^(-2i / Hd). Each layout keeps the arithmetic its checkpoints were trained
with: "pairs" rotates in fp32 and rounds once, "halves" in x's dtype.

Shape letters: N = positions, H = heads, Hd = head dim.
"""
from __future__ import annotations

import torch

LAYOUTS = ("pairs", "halves")


def angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """(..., N, Hd/2) fp32: each position (..., N) times each channel pair's frequency."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    return positions.float()[..., None] * inv_freq


def rotary(positions: torch.Tensor, head_dim: int, theta: float, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of the angles at positions (..., N), laid out for the rotation of `layout`: "pairs" (..., N, 1, Hd/2)
    (one per pair, broadcast over heads), "halves" (..., N, Hd) (the angles repeated for the second half)."""
    if layout not in LAYOUTS:
        raise ValueError(f"rotary layout {layout!r}: one of {LAYOUTS}")
    turn = angles(positions, head_dim, theta)
    turn = turn[..., None, :] if layout == "pairs" else torch.cat([turn, turn], dim=-1)
    return turn.cos(), turn.sin()


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., N, H, Hd) with each pair (x[2i], x[2i + 1]) rotated by its angle, computed in fp32."""
    even, odd = x.float().unflatten(-1, (-1, 2)).unbind(-1)  # (..., N, H, Hd/2) each
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2).type_as(x)


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., N, Hd) rotated by position: x cos + rotate_half(x) sin, in x's dtype."""
    first, second = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-second, first], dim=-1) * sin.to(x.dtype)
