"""A trained DiT drafter (DraftNet) as the engine drafts with it: frozen weights, fixed times, a growing context.

Shape letters: B = blocks, K = slots, C = context positions (window + anchor), W = window, N = new positions,
D = drafter width, L = drafter layers, V = draft vocabulary, D_t = target width.

Why: a one-jump draft always runs at the same time pair ((0, 1) for FlashMap, (0, 0) for DFlash-style), and the
context window slides by a few positions a round. Computed from scratch, each proposal re-derived the time
conditioning (every block's adaLN linear, a third of the network's weights) and re-projected all W + 1 context
positions through every block's cross-attention key and value maps, so a 16-slot proposal cost as much as a step
of the 135M target. Here both are kept:
- the conditioning of each time pair is computed once (the weights are frozen);
- each block's cross-attention keys and values are linear in the context row, K = W_k (c + p) + b, so the
  W_k c part is computed once per position, when it enters the window, and the W_k p + b part (position by
  distance to the anchor) is a constant table: a proposal adds the two, and projects only the anchor.
The result equals DraftNet's forward up to float rounding (tests/test_frozen.py); the draft is a proposal that
the target verifies, so the engine's output is exact either way.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from core import cpu_linear
from drafter.network import DraftNet


def no_autograd(method):
    """Run under no_grad and outside inference mode: what is kept (buffers, the packed head) serves a proposal
    under the engine's inference mode as well as a test's call with gradients on."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with torch.inference_mode(False), torch.no_grad():
            return method(*args, **kwargs)
    return wrapper


@dataclass(frozen=True)
class CachedContext:
    """A context whose cross-attention key and value maps are already computed: stands where DraftNet reads a
    (B, C, D) context tensor (network.project calls `linear`)."""

    maps: dict  # layer (each block's cross_attn.k and .v) -> its output over the context (B, C, D)
    shape: tuple  # (B, C, D)

    @property
    def device(self) -> torch.device:
        return next(iter(self.maps.values())).device

    def linear(self, layer: nn.Linear) -> torch.Tensor:
        return self.maps[layer]  # (B, C, D)

    def repeat_interleave(self, repeats: int, dim: int = 0) -> "CachedContext":
        """M drafts of each context in one pass (best-of-M, trees). -> (B*M, C, D)"""
        maps = {layer: value.repeat_interleave(repeats, dim) for layer, value in self.maps.items()}
        return CachedContext(maps, (self.shape[0] * repeats, *self.shape[1:]))


class FrozenDraftNet:
    """DraftNet for inference with the conditioning of each time pair and the context's key/value maps kept.
    Everything else (cfg, noise_input, embed_matrix, ...) is the network's own."""

    def __init__(self, net: DraftNet):
        self.net = net
        self.kv_layers = [layer for block in net.blocks for layer in (block.cross_attn.k, block.cross_attn.v)]
        self._params = list(net.parameters())  # walking the modules for them on every check cost 0.14 ms
        self._weights_key: tuple | None = None
        self._maps = torch.empty(0)  # the last context's maps (C, 2L*D), reused: a fresh 1 MB tensor a round cost

    def __getattr__(self, name: str):
        return getattr(self.net, name)  # only reached for what this class does not define

    @no_autograd
    def _refresh(self) -> None:
        """(Re)build what is kept from the weights when they are new or have changed (a test that trains and drafts,
        a load); a drafter in the app is frozen, so this builds once."""
        key = tuple((p._version, p.data_ptr()) for p in self._params)
        if key == self._weights_key:
            return
        self.kv_weight = torch.cat([layer.weight for layer in self.kv_layers]).detach()  # (2L*D, D)
        kv_bias = torch.cat([layer.bias for layer in self.kv_layers]).detach()  # (2L*D,)
        self.kv_pos = F.linear(self.net.ctx_pos.detach(), self.kv_weight, kv_bias)  # (W+1, 2L*D) by distance
        # the LM head rows as a (prepacked, where oneDNN is built in) linear layer: x @ head.T took 1.9 ms a proposal
        # on one core, a third of it
        head = nn.Linear(self.net.cfg.target_hidden, self.net.cfg.draft_vocab, bias=False)
        head.weight = nn.Parameter(self.net.head_matrix().detach().clone(), requires_grad=False)  # (V, D_t)
        self.head = cpu_linear.PackedLinear(head) if cpu_linear.available() else head
        self._conditioning: dict[tuple, tuple] = {}
        self._weights_key = key

    @no_autograd
    def rows(self, projected: torch.Tensor) -> torch.Tensor:
        """Each new position's share of every block's key and value maps. projected (N, D) after ctx_in -> (N, 2L*D)"""
        self._refresh()
        return F.linear(projected, self.kv_weight)  # (N, 2L*D)

    @no_autograd
    def context(self, rows: torch.Tensor, anchor_embed: torch.Tensor) -> tuple[CachedContext, torch.Tensor]:
        """The context of one block: the window's rows (n <= W, 2L*D) from `rows`, oldest first, and the anchor's
        input embedding (1, D_t) -> CachedContext (1, n+1, D) and its mask (1, n+1), all True (no padding). The maps
        live in a buffer the next call overwrites: one proposal at a time."""
        self._refresh()
        d = self.net.cfg.d_model
        n = rows.shape[0]
        if self._maps.shape != (n + 1, self.kv_weight.shape[0]):
            self._maps = torch.empty(n + 1, self.kv_weight.shape[0])  # (C, 2L*D)
        maps = self._maps
        torch.add(rows, self.kv_pos[-n - 1 : -1], out=maps[:n])  # (n, 2L*D)
        anchor = F.linear(self.net.anchor_in(anchor_embed), self.kv_weight)  # (1, 2L*D)
        torch.add(anchor, self.kv_pos[-1:], out=maps[n:])
        per_layer = maps.split(d, dim=-1)  # 2L x (C, D): k0, v0, k1, v1, ...
        cached = CachedContext({layer: value[None] for layer, value in zip(self.kv_layers, per_layer)},
                               (1, maps.shape[0], d))
        return cached, torch.ones(1, maps.shape[0], dtype=torch.bool)

    def conditioning(self, s: torch.Tensor, t: torch.Tensor):
        """DraftNet.conditioning, computed once per time pair (and batch size)."""
        key = (tuple(s.tolist()), tuple(t.tolist()))
        if key not in self._conditioning:
            self._conditioning[key] = self.net.conditioning(s, t)
        return self._conditioning[key]

    @no_autograd
    def __call__(self, slot_input, s, t, context, context_mask) -> torch.Tensor:
        """DraftNet.forward. A CachedContext has no padding, so its all-True mask is not read. -> logits (B, K, V)"""
        self._refresh()
        mask = None if isinstance(context, CachedContext) else context_mask
        hidden = self.net.trunk(slot_input, self.conditioning(s, t), context, mask)  # (B, K, D_t)
        return self.head(hidden)  # (B, K, V)

    def probs(self, slot_input, s, t, context, context_mask) -> torch.Tensor:
        return torch.softmax(self(slot_input, s, t, context, context_mask).float(), dim=-1)  # (B, K, V)
