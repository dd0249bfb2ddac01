"""Prepacked oneDNN linear layers for an fp32 target on the CPU.

Why: with torch's default CPU linear (MKL), one position is a fast matrix-vector product but two or more
positions take the matrix-matrix path, which repacks the whole weight on every call. On these CPUs that made a
forward over K + 1 = 17 positions cost ~1.9x one position (and 2 positions ~1.8x), so a draft had to be accepted
almost twice per round just to break even. oneDNN's linear with its weight reordered once at load time
(`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's CPU freezing uses) skips that: measured here on
SmolLM2-135M's shapes, 2 threads, the 49152 x 576 LM head takes 5.0 ms for 1 position and 6.1 ms for 17 (MKL:
11.5 and 26.0), a 1536 x 576 MLP weight 0.05 and 0.16 ms (0.10 and 0.42); `python -m core.verify_cost` shows
the whole forward.

Exactness: each row of the output comes out bit-identical whether it is computed alone or among 17 rows for most
shapes (MKL's matrix-vector and matrix-matrix paths never are), so plain decoding and a verify forward agree at
least as well as before. The packed copy is used only for inference in fp32 on the CPU, outside autocast and
autograd; anything else (training, bf16 autocast for features, another dtype or device) takes F.linear on the
original weight, which stays in place (tied embeddings stay tied, `state_dict` is unchanged).

Shape letters: N = rows (batch x positions), I = in features, O = out features.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

PACK_HINT_ROWS = 17  # oneDNN picks its weight layout for this many rows (K + 1 at K = 16); it serves 1..64 well


def available() -> bool:
    """oneDNN is built into this torch and has the prepacked linear ops."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight") and hasattr(
        ops, "_linear_pointwise")


class PackedLinear(torch.nn.Linear):
    """nn.Linear that, for fp32 inference on the CPU, multiplies by a weight prepacked once for oneDNN.
    The weight must not change after packing (a frozen target)."""

    def __init__(self, linear: torch.nn.Linear):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same Parameters: ties and state_dict unchanged
        with torch.no_grad():
            # (O, I) in oneDNN's blocked layout, chosen for PACK_HINT_ROWS rows
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_HINT_ROWS)

    def _packed_applies(self, x: torch.Tensor) -> bool:
        return (x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled()
                and not torch.is_autocast_enabled("cpu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._packed_applies(x):
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)  # (..., I) -> (N, I)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")  # (N, O)
        return out.reshape(*x.shape[:-1], self.out_features)  # (N, O) -> (..., O)


def pack_linears(model: torch.nn.Module) -> int:
    """Swap every nn.Linear of an fp32 CPU model for a PackedLinear in place; returns how many were packed
    (0 when oneDNN is unavailable, or the model is not fp32 on the CPU)."""
    first = next(model.parameters())
    if not available() or first.device.type != "cpu" or first.dtype != torch.float32:
        return 0
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is torch.nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)
