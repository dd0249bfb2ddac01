"""The DiT drafters' trunks as one native call (drafter/runtime/csrc/dit_trunk.cpp), for drafting with frozen weights:
the
project's network (NativeTrunk) and the released FlashMap DiT (ReleaseTrunk).

Shape letters: B = blocks, K = slots, R = B*K rows, D = drafter width, L = layers, C = context positions,
D_t = target width.

Why: at a fixed time pair and with the context's key/value maps kept (drafter/runtime/frozen.py), what was left of a
proposal was ~130 small tensor ops dispatched from Python, most of its time where the products take a small share
(docs/journal/engine.md). The native trunk runs the same network in plain loops over weights packed once; where it
cannot be built, FrozenDraftNet keeps the Python trunk (same drafts up to float rounding, slower).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from core.runtime import cpu_linear, native

DIT_TRUNK = native.Extension("flashmap_dit_trunk", Path(__file__).parent / "csrc" / "dit_trunk.cpp",
                             "the native drafter trunk")


def load():
    """(the compiled module, "") or (None, why not)."""
    return native.load(DIT_TRUNK)


PRODUCTS = ("fp32", "8-bit")  # what the trunk's products can multiply (dit_trunk.cpp; 8-bit where the build has it)


def products_for(module, products: str | None) -> str:
    """The products to draft with: the build's fastest (module.PRODUCTS) for None, else the one asked for."""
    chosen = products or module.PRODUCTS
    if chosen not in PRODUCTS or (chosen == "8-bit" and module.PRODUCTS != "8-bit"):
        raise ValueError(f"the native trunk here multiplies {module.PRODUCTS} or fp32, not {chosen}")
    return chosen


def pack(module, weight: torch.Tensor, products: str | None = None) -> torch.Tensor:
    """An nn.Linear weight (N, I) as the trunk's products read it: fp32 panels, or 8-bit codes (products_for): GGUF's
    Q8_0 blocks of 16 outputs x 32 inputs, zero-padded to whole blocks (core.runtime.cpu_linear.pack_q8_blocks,
    "bytes")."""
    weight = weight.detach().float().contiguous()  # (N, I)
    if products_for(module, products) == "fp32":
        return module.pack(weight)  # (N/32, I, 32)
    n, i = weight.shape
    padded = F.pad(weight, (0, -i % cpu_linear.Q4_GROUP, 0, -n % 16))  # (N', I'): whole blocks
    return cpu_linear.pack_q8_blocks(*cpu_linear.quantize_q8(padded), "bytes")  # (N'/16, I'/32, 136)


def _eps(norm: nn.RMSNorm) -> float:
    """An RMSNorm's eps as torch applies it (None: the dtype's machine epsilon)."""
    return norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps


def packed_linear(module, products: str, *layers: nn.Linear) -> list[torch.Tensor]:
    """Linear layers side by side along their outputs (q | k | v) as a trunk reads them -> [packed weight, bias (N,)]
    (zeros where a layer has no bias)."""
    weight = torch.cat([layer.weight.detach().float() for layer in layers])  # (N, I)
    bias = torch.cat([layer.bias.detach().float() if layer.bias is not None else torch.zeros(layer.weight.shape[0])
                      for layer in layers])  # (N,)
    return [pack(module, weight, products), bias.contiguous()]


def norm_weights(*norms: nn.RMSNorm) -> list[torch.Tensor]:
    """Norms' weights (E,) as a trunk reads them: contiguous fp32."""
    return [norm.weight.detach().float().contiguous() for norm in norms]


class NativeLinear:
    """x @ W^T + b through the native product, faster than oneDNN's prepacked linear on the LM head rows and than
    torch's on one row (docs/journal/engine.md). weight (N, I), kept packed; bias (N,) or None."""

    def __init__(self, module, weight: torch.Tensor, bias: torch.Tensor | None = None, products: str | None = None):
        self.module = module
        with torch.no_grad():
            self.packed = pack(module, weight, products)  # fp32 panels or 8-bit blocks
            self.bias = torch.zeros(weight.shape[0]) if bias is None else bias.detach().float().contiguous()  # (N,)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float().contiguous()  # (..., I) -> (R, I)
        return self.module.linear(rows, self.packed, self.bias).view(*x.shape[:-1], -1)  # (..., N)


class NativeTrunk:
    """DraftNet.trunk for frozen weights, run natively: built from a DraftNet, called with the slot input, one time
    pair's conditioning and the context's key/value maps. The weights are copied and packed here: rebuild it when
    they change (FrozenDraftNet does)."""

    def __init__(self, net, module, products: str | None = None):
        self.module = module
        self.products = products_for(module, products)
        self.heads = net.cfg.n_heads
        norms = [attn.q_norm for block in net.blocks for attn in (block.self_attn, block.cross_attn)]
        if len({_eps(n) for n in norms}) != 1:
            raise ValueError("the native trunk needs one QK-norm eps")
        self.qk_eps = _eps(norms[0])
        self.ln_eps = net.blocks[0].norms[0].eps
        with torch.no_grad():
            self.weights = self._pack(net)

    def _linear(self, *layers: nn.Linear) -> list[torch.Tensor]:
        return packed_linear(self.module, self.products, *layers)

    def _pack(self, net) -> list[torch.Tensor]:
        """The order dit_trunk.cpp reads: slot_in, slot_pos; per block its 16 tensors (Slot enum); out."""
        tensors = [*self._linear(net.slot_in), net.slot_pos.detach().float().contiguous()]
        for block in net.blocks:
            sa, ca = block.self_attn, block.cross_attn
            tensors += [*self._linear(sa.q, sa.k, sa.v), *norm_weights(sa.q_norm, sa.k_norm), *self._linear(sa.o),
                        *self._linear(ca.q), *norm_weights(ca.q_norm, ca.k_norm), *self._linear(ca.o),
                        *self._linear(block.mlp[0]), *self._linear(block.mlp[2])]
        return tensors + self._linear(net.out)

    @staticmethod
    def modulations(conditioning) -> torch.Tensor:
        """DraftNet.conditioning of one time pair (batch row 0) as the native trunk reads it -> (9L + 2, D)."""
        block_mods, (shift, scale) = conditioning
        rows = [m[0] for mods in block_mods for m in mods] + [shift[0], scale[0]]
        return torch.stack(rows).float().contiguous()  # (9L + 2, D)

    def __call__(self, slot_input: torch.Tensor, mods: torch.Tensor, maps: torch.Tensor) -> torch.Tensor:
        """slot_input (B, K, D_t), mods (9L + 2, D), maps (C, 2L*D) shared by the B blocks -> (B, K, D_t)."""
        b, k, dt = slot_input.shape
        rows = slot_input.reshape(b * k, dt).float().contiguous()  # (B, K, D_t) -> (R, D_t)
        out = self.module.trunk(rows, k, maps, mods, self.weights, self.heads, self.ln_eps, self.qk_eps)  # (R, D_t)
        return out.view(b, k, -1)


class ReleaseTrunk:
    """ReleaseNet's DiT at one jump over one block, run natively (dit_trunk.cpp's release_trunk): built from a
    ReleaseNet with weights that no longer change, called with the slots' inputs, their rotary angles, one jump's
    modulations and the context's key and value buffers (drafter.runtime.release.ContextRows)."""

    def __init__(self, net, module, products: str | None = None):
        self.module = module
        self.products = products_for(module, products)
        self.heads = net.c.num_attention_heads
        self.ln_eps, self.qk_eps = net.c.layer_norm_eps, net.c.qk_norm_eps
        with torch.no_grad():
            self.weights = self._pack(net)

    def _linear(self, *layers: nn.Linear) -> list[torch.Tensor]:
        return packed_linear(self.module, self.products, *layers)

    def _pack(self, net) -> list[torch.Tensor]:
        """The order release_trunk reads: x_embed; per layer its 15 tensors (ReleaseSlot); head."""
        tensors = self._linear(net.x_embed)
        for layer in net.layers:
            sa, ca, mlp = layer.self_attn, layer.cross_attn, layer.mlp
            tensors += [*self._linear(sa.q_proj, sa.k_proj, sa.v_proj), *norm_weights(sa.q_norm, sa.k_norm),
                        *self._linear(sa.o_proj), *self._linear(ca.q_proj), *norm_weights(ca.q_norm),
                        *self._linear(ca.o_proj), *self._linear(mlp.fc1), *self._linear(mlp.fc2)]
        return tensors + self._linear(net.head)

    @staticmethod
    def modulations(modulations) -> torch.Tensor:
        """ReleaseNet.modulations of one jump as release_trunk reads them -> (9L + 2, D): per layer the three
        AdaNorms' scale, shift, gate, then the final norm's scale and shift."""
        layer_mods, final = modulations
        rows = [m for layer in layer_mods for mod in layer for m in mod] + list(final[:2])
        return torch.stack([m.reshape(-1) for m in rows]).float().contiguous()  # (9L + 2, D)

    def __call__(self, inputs: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mods: torch.Tensor,
                 keys_t: list[torch.Tensor], values: list[torch.Tensor], context: int) -> torch.Tensor:
        """inputs (K, D_t); cos, sin (K, Hd/2); mods (9L + 2, D); per layer keys_t (H, Hd, capacity) and values
        (H, capacity, Hd), the first `context` positions read -> (K, D_t)."""
        return self.module.release_trunk(inputs.float().contiguous(), cos, sin, keys_t, values, context, mods,
                                         self.weights, self.heads, self.ln_eps, self.qk_eps)
