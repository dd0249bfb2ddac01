"""8-bit weights read at one byte a weight with no activation quantisation: int8 codes with one fp32 scale per output
row, multiplied by the bf16 activations inside one Triton kernel (weight-only).

Shape letters: R = rows (batch x positions), I = in features, O = out features.

Why: a decode step reads every weight once, so its floor is the weights' bytes over the memory bandwidth, and 8-bit
weights halve it. core.runtime.fp8 reached the bytes but quantised every activation row to e4m3 for torch._scaled_mm in
several small kernels per linear, and ran slower than bf16 at batch 1 (docs/journal/gpu.md). Here the activations stay
bf16: a program holds BLOCK_O output rows and sweeps the inputs BLOCK_I at a time, loading a tile of x (up to BLOCK_R
rows: a decode step's 1; a verify's 17 take two tiles) and the int8 codes of its outputs, widening the codes to bf16
(exact: |code| <= 127 needs 7 bits of the 8 a bf16 mantissa has) and accumulating their tensor-core product in fp32
(other activation dtypes multiply their tiles in fp32); the row scales multiply once at the end, since a scale is
constant along its row's sum. One kernel a linear, one byte read a weight. int8 rather than e4m3 codes: every GPU widens
them, where torch's row-scaled e4m3 product is refused on sm_120 (RTX 5090).

Exactness: each output row depends on its own input row only, and every output's sum runs over the same BLOCK_I
chunks in the same order whatever the row count, so a verify over K + 1 positions and a one-position step differ only
where the tensor-core product orders a chunk's terms differently, the caveat bf16 carries (README).

Where Triton is absent (the CPU app's environment) the same product runs in torch (`reference`), for the tests and
the CPU simulation of the GPU run. TRITON_INTERPRET=1 runs the kernel itself on the CPU (tests/test_w8.py), its tiles'
product in fp32 (BF16_DOT off): Triton 3.9's interpreter widens int8 to bf16 by reinterpreting the bits and multiplies
bf16 tiles wrongly, so there the indexing, masks, scales and bias are what is checked; the bf16 tensor-core product
is checked against `reference` on the GPU (the GPU run's qwen3_w8 stage, `kernel_vs_torch`).
"""
from __future__ import annotations

import importlib.util
import os

import torch

BLOCK_R = 16  # rows a program multiplies at once: tl.dot's least; a decode step's 1 and a verify's 17 are masked in
BLOCK_O = 32  # output rows a program holds (a program per 32 of O: 128 programs for O = 4,096)
BLOCK_I = 256  # inputs a sweep step loads
CODE_MAX = 127


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (O, I) -> int8 codes (O, I) and fp32 scales (O,), weight ~= codes * scale[:, None], each row scaled by
    its own amax (an all-zero row gets scale 1 and zero codes)."""
    w32 = weight.detach().float()
    scale = w32.abs().amax(dim=1) / CODE_MAX  # (O,)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round(w32 / scale[:, None]).clamp(-CODE_MAX, CODE_MAX).to(torch.int8)  # (O, I)
    return codes, scale


def reference(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's product in torch: rows x (R, I) -> (R, O) in x's dtype, accumulated in fp32."""
    out = (x.float() @ codes.float().T) * scale  # (R, O)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


_kernel = None


def kernel():
    """The compiled Triton kernel (built on first use), or None without Triton."""
    global _kernel
    if _kernel is None and triton_available():
        _kernel = _build()
    return _kernel


def _build():
    import triton
    import triton.language as tl

    @triton.jit
    def w8_product(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, rows, ins, outs, stride_x, stride_w, stride_out,
                   HAS_BIAS: tl.constexpr, BF16_DOT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_O: tl.constexpr,
                   BLOCK_I: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,) rows of x and out
        o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)  # (BLOCK_O,) output rows of the weight
        acc = tl.zeros((BLOCK_R, BLOCK_O), dtype=tl.float32)
        for start in range(0, ins, BLOCK_I):
            i = start + tl.arange(0, BLOCK_I)  # (BLOCK_I,)
            x = tl.load(x_ptr + r[:, None] * stride_x + i[None, :], mask=(r[:, None] < rows) & (i[None, :] < ins),
                        other=0.0)  # (BLOCK_R, BLOCK_I)
            w = tl.load(w_ptr + o[:, None] * stride_w + i[None, :], mask=(o[:, None] < outs) & (i[None, :] < ins),
                        other=0)  # (BLOCK_O, BLOCK_I) int8
            if BF16_DOT:  # tensor cores: codes widened to bf16 exactly (through fp32: see BF16_DOT's note)
                acc += tl.dot(x.to(tl.bfloat16), tl.trans(w.to(tl.float32).to(tl.bfloat16)))
            else:
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        acc = acc * tl.load(scale_ptr + o, mask=o < outs, other=0.0)[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + o, mask=o < outs, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + r[:, None] * stride_out + o[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=(r[:, None] < rows) & (o[None, :] < outs))

    return w8_product


def product(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (R, I) @ (codes * scale)^T + bias -> (R, O) in x's dtype: the Triton kernel on a GPU, or on the CPU under
    TRITON_INTERPRET=1; torch's `reference` elsewhere."""
    run = kernel() if (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1") else None
    if run is None:
        return reference(x, codes, scale, bias)
    rows, ins = x.shape
    outs = codes.shape[0]
    x = x.contiguous()
    out = torch.empty(rows, outs, dtype=x.dtype, device=x.device)
    grid = ((rows + BLOCK_R - 1) // BLOCK_R, (outs + BLOCK_O - 1) // BLOCK_O)
    run[grid](x, codes, scale, bias if bias is not None else scale, out, rows, ins, outs, x.stride(0),
              codes.stride(0), out.stride(0), HAS_BIAS=bias is not None,
              BF16_DOT=x.is_cuda and x.dtype == torch.bfloat16, BLOCK_R=BLOCK_R,
              BLOCK_O=BLOCK_O, BLOCK_I=BLOCK_I)
    return out


class W8Linear(torch.nn.Module):
    """A linear layer from int8 weight codes (one fp32 scale per output row), multiplied by bf16 activations."""

    def __init__(self, linear: torch.nn.Linear, device: torch.device | str | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(device or linear.weight.device)
        codes, scale = quantize(weight)  # (O, I), (O,)
        self.weight_codes: torch.Tensor
        self.weight_scale: torch.Tensor
        self.bias: torch.Tensor | None
        self.register_buffer("weight_codes", codes.contiguous())
        self.register_buffer("weight_scale", scale.contiguous())
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (R, I)
        out = product(rows, self.weight_codes, self.weight_scale, self.bias)  # (R, O)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 row-scaled, weight-only"


def quantize_decoder(model, device: torch.device | None = None) -> int:
    """Replace every nn.Linear of the decoder layers by a W8Linear (each bf16 weight freed as its codes are made);
    the embeddings, norms and LM head stay. Returns the number replaced."""
    from core.runtime.fp8 import decoder_linears

    linears = decoder_linears(model)
    for parent, name, linear in linears:
        setattr(parent, name, W8Linear(linear, device))
        linear.register_parameter("weight", None)  # its bf16 weight goes now
    return len(linears)
