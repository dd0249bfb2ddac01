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
The trunk then runs as one native call where drafter/runtime/csrc/dit_trunk.cpp builds
(drafter/runtime/native_trunk.py), with the
LM head rows and the context projections through the same product kernel; elsewhere it runs op by op. The result
equals DraftNet's forward up to float rounding (tests/test_frozen.py, tests/test_native_trunk.py); the draft is a
proposal that the target verifies, so the engine's output is exact either way.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from core.runtime import cpu_linear
from drafter.networks.dit import DraftNet
from drafter.runtime import native_trunk

_told: set[str] = set()  # why the native trunk is unavailable, logged once a process


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
    """A context whose cross-attention key and value maps are already computed, read alike by `batch` blocks: stands
    where DraftNet reads a (B, C, D) context tensor (network.project calls `linear`)."""

    maps: torch.Tensor  # (C, 2L*D) every block's key and value maps over the context: k0 | v0 | k1 | v1 ...
    layers: tuple  # the 2L linear layers whose outputs those columns are, in that order
    batch: int = 1

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.batch, self.maps.shape[0], self.maps.shape[1] // len(self.layers)  # (B, C, D)

    @property
    def device(self) -> torch.device:
        return self.maps.device

    def linear(self, layer: nn.Linear) -> torch.Tensor:
        d = self.shape[2]
        column = self.layers.index(layer) * d
        return self.maps[:, column : column + d][None].expand(self.batch, -1, -1)  # (C, D) -> (B, C, D)

    def repeat_interleave(self, repeats: int, dim: int = 0) -> "CachedContext":
        """M drafts of each context in one pass (best-of-M, trees): the same maps, read by B*M blocks."""
        return replace(self, batch=self.batch * repeats)


class FrozenDraftNet:
    """DraftNet for inference with the conditioning of each time pair and the context's key/value maps kept.
    Everything else (cfg, noise_input, embed_matrix, ...) is the network's own."""

    def __init__(self, net: DraftNet, products: str | None = None, watch: bool = True):
        self.net = net
        self.products = products  # the native products (native_trunk.products_for); None: the build's fastest
        # watch: rebuild when the weights change (a test that trains and drafts). A loaded drafter's never change, and
        # the check (every parameter's version and address) cost several times a proposal (docs/journal/engine.md)
        self.watch = watch
        self.kv_layers = [layer for block in net.blocks for layer in (block.cross_attn.k, block.cross_attn.v)]
        self._params = list(net.parameters())  # walking the modules for them on every check cost more than the check
        self._weights_key: tuple | None = None
        self._maps = torch.empty(0)  # the last context's maps (C, 2L*D), reused rather than a fresh 1 MB tensor a round
        self._refresh()  # now, not at the first proposal: a first build of the native trunk belongs to loading

    def __getattr__(self, name: str):
        return getattr(self.net, name)  # only reached for what this class does not define

    @no_autograd
    def _refresh(self) -> None:
        """(Re)build what is kept from the weights when they are new or have changed (a test that trains and drafts,
        a load); a drafter in the app is frozen, so this builds once."""
        if not self.watch and self._weights_key is not None:
            return
        key = tuple((p._version, p.data_ptr()) for p in self._params)
        if key == self._weights_key:
            return
        self.kv_weight = torch.cat([layer.weight for layer in self.kv_layers]).detach()  # (2L*D, D)
        kv_bias = torch.cat([layer.bias for layer in self.kv_layers]).detach()  # (2L*D,)
        self.kv_pos = F.linear(self.net.ctx_pos.detach(), self.kv_weight, kv_bias)  # (W+1, 2L*D) by distance
        self.native = self._native_trunk()
        self.kv = self._product(self.kv_weight)  # (D) -> (2L*D): a position's share of every key and value map
        self.ctx_in, self.anchor_in = (self._projection(cast(nn.Sequential, self.net.ctx_in)),
                                       self._projection(self.net.anchor_in))
        # the LM head rows (V, D_t) as a linear layer: x @ head.T took a third of a proposal (docs/journal/engine.md)
        self.head = self._product(self.net.head_matrix().detach().clone())
        self._start = self.net.start_state()  # (D_t,) every slot's input in a jump from x0 = 0
        self._conditioning: dict[tuple, tuple] = {}
        self._weights_key = key

    def _native_trunk(self) -> native_trunk.NativeTrunk | None:
        """The trunk as one native call, or None (and one logged line saying why) where it cannot be built."""
        module, why = native_trunk.load()
        if module is None:
            if why not in _told:
                _told.add(why)
                logging.getLogger(__name__).warning("the drafter's trunk runs op by op in Python: %s", why)
            return None
        return native_trunk.NativeTrunk(self.net, module, self.products)

    def _projection(self, layers: nn.Sequential) -> tuple:
        """ctx_in or anchor_in (a linear layer, then an RMSNorm) as (its product, its norm)."""
        linear = cast(nn.Linear, layers[0])
        return self._product(linear.weight, linear.bias), layers[1]

    def _product(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        """x @ weight.T + bias for frozen weights: native where the trunk is, else torch's linear (prepacked for oneDNN
        where it is built in)."""
        if self.native is not None:
            return native_trunk.NativeLinear(self.native.module, weight, bias, self.native.products)
        layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        layer.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)  # (N, I)
        if bias is not None:
            layer.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)  # (N,)
        return cpu_linear.PackedLinear(layer) if cpu_linear.available() else layer

    @no_autograd
    def rows(self, features: torch.Tensor) -> torch.Tensor:
        """Each new position's share of every block's key and value maps: ctx_in, then the maps' weights.
        features (N, F) -> (N, 2L*D)"""
        self._refresh()
        product, norm = self.ctx_in
        return self.kv(norm(product(features)))  # (N, D) -> (N, 2L*D)

    @no_autograd
    def context(self, rows: torch.Tensor, anchor_embed: torch.Tensor) -> tuple[CachedContext, torch.Tensor]:
        """The context of one block: the window's rows (n <= W, 2L*D) from `rows`, oldest first, and the anchor's
        input embedding (1, D_t) -> CachedContext (1, n+1, D) and its mask (1, n+1), all True (no padding). The maps
        live in a buffer the next call overwrites: one proposal at a time."""
        self._refresh()
        n = rows.shape[0]
        if self._maps.shape != (n + 1, self.kv_weight.shape[0]):
            self._maps = torch.empty(n + 1, self.kv_weight.shape[0])  # (C, 2L*D)
        maps = self._maps
        torch.add(rows, self.kv_pos[-n - 1 : -1], out=maps[:n])  # (n, 2L*D)
        product, norm = self.anchor_in
        anchor = self.kv(norm(product(anchor_embed)))  # (1, D_t) -> (1, D) -> (1, 2L*D)
        torch.add(anchor, self.kv_pos[-1:], out=maps[n:])
        return CachedContext(maps, tuple(self.kv_layers)), torch.ones(1, maps.shape[0], dtype=torch.bool)

    @no_autograd
    def start_state(self) -> torch.Tensor:
        """DraftNet.start_state, kept: the slot input of a jump from x0 = 0 (the T = 0 draft) is this alone."""
        self._refresh()
        return self._start

    def conditioning(self, s: torch.Tensor, t: torch.Tensor):
        """DraftNet.conditioning, computed once per time pair (and batch size)."""
        return self._kept_conditioning(s, t)[0]

    def _kept_conditioning(self, s: torch.Tensor, t: torch.Tensor) -> tuple:
        """(DraftNet.conditioning, its (9L + 2, D) rows for the native trunk or None where the blocks' times differ)"""
        key = (tuple(s.tolist()), tuple(t.tolist()))
        if key not in self._conditioning:
            conditioning = self.net.conditioning(s, t)
            uniform = len(set(key[0])) == 1 and len(set(key[1])) == 1
            mods = native_trunk.NativeTrunk.modulations(conditioning) if uniform else None
            self._conditioning[key] = (conditioning, mods)
        return self._conditioning[key]

    @no_autograd
    def __call__(self, slot_input, s, t, context, context_mask) -> torch.Tensor:
        """DraftNet.forward. A CachedContext has no padding, so its all-True mask is not read. -> logits (B, K, V)"""
        self._refresh()
        conditioning, mods = self._kept_conditioning(s, t)
        if not isinstance(context, CachedContext):
            hidden = self.net.trunk(slot_input, conditioning, context, context_mask)  # (B, K, D_t)
        elif self.native is not None and mods is not None:
            hidden = self.native(slot_input, mods, context.maps)  # (B, K, D_t)
        else:
            hidden = self.net.trunk(slot_input, conditioning, context, None)  # (B, K, D_t)
        return self.head(hidden)  # (B, K, V)

    def probs(self, slot_input, s, t, context, context_mask) -> torch.Tensor:
        return torch.softmax(self(slot_input, s, t, context, context_mask).float(), dim=-1)  # (B, K, V)
