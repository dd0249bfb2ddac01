"""Prepacked oneDNN linear layers for an fp32 target on the CPU.

Why: with torch's default CPU linear (MKL), one position is a fast matrix-vector product but two or more
positions take the matrix-matrix path, which repacks the whole weight on every call. On these CPUs that made a
forward over K + 1 = 17 positions cost nearly two of one position, so a draft had to be accepted almost twice per
round just to break even. oneDNN's linear with its weight reordered once at load time
(`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's CPU freezing uses) skips that (figures:
docs/journal/engine.md; `python -m core.runtime.verify_cost` shows the whole forward).

Exactness: each row of the output comes out bit-identical whether it is computed alone or among 17 rows for most
shapes (MKL's matrix-vector and matrix-matrix paths never are), so plain decoding and a verify forward agree at
least as well as before. The packed copy is used only for inference in fp32 on the CPU, outside autocast and
autograd; anything else (training, bf16 autocast for features, another dtype or device) takes F.linear on the
original weight, which stays in place (tied embeddings stay tied, `state_dict` is unchanged).

Shape letters: N = rows (batch x positions), I = in features, O = out features.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from core.runtime.threads import cpu_flags

# oneDNN reorders a bf16 weight only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT (it raises on AVX2-only ones)
BF16_PACK_FLAGS = (frozenset({"avx512bw", "avx512vl", "avx512dq"}), frozenset({"avx_ne_convert"}))
PACK_HINT_ROWS = 17  # oneDNN picks its weight layout for this many rows (K + 1 at K = 16); it serves 1..64 well
# bf16: oneDNN gives every row the same result for 1..17 rows only while the inner dimension stays within this
# (measured on AVX512-BF16: 1,024 invariant, 1,536 not, from 2 rows on); wider weights are split into equal slices
# along it, each multiplied on its own, and the slices' products summed in fp32 in a fixed order
INVARIANT_INNER = 1024


def amx_products(flags: frozenset[str] | None = None) -> bool:
    """Whether oneDNN may multiply bf16 with AMX here: the CPU has it and the ISA cap (core/__init__.py sets one below
    AMX unless the environment chose another) allows it. Its products are not batch-invariant
    (core.runtime.exactness)."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return "amx_bf16" in (cpu_flags() if flags is None else flags) and any(w in isa for w in ("AMX", "ALL", "DEFAULT"))


def inner_slices(in_features: int, limit: int = INVARIANT_INNER) -> int:
    """The fewest equal slices of the inner dimension, each at most `limit` wide (1 when none is needed)."""
    for n in range(1, in_features + 1):
        if in_features % n == 0 and in_features // n <= limit:
            return n
    return in_features


def packed_dtypes(flags: frozenset[str]) -> tuple[torch.dtype, ...]:
    """The weight dtypes oneDNN can prepack on a CPU with these /proc/cpuinfo flags."""
    return (torch.float32, torch.bfloat16) if any(need <= flags for need in BF16_PACK_FLAGS) else (torch.float32,)


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
        n_slices = inner_slices(self.in_features) if self.weight.dtype == torch.bfloat16 else 1
        with torch.no_grad():
            # (O, I / n_slices) each, in oneDNN's blocked layout, chosen for PACK_HINT_ROWS rows
            self.packed_slices = [torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACK_HINT_ROWS)
                                  for w in self.weight.detach().chunk(n_slices, dim=1)]

    def drop_packed(self) -> None:
        """Free the packed copy (another holds these weights packed, core.runtime.lean); forward then uses F.linear."""
        self.packed_slices = []  # (none: F.linear)

    def _packed_applies(self, x: torch.Tensor) -> bool:
        return (bool(self.packed_slices) and x.device.type == "cpu" and x.dtype == self.weight.dtype
                and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._packed_applies(x):
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)  # (..., I) -> (N, I)
        if len(self.packed_slices) == 1:
            out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_slices[0], self.bias, "none", [], "")  # (N, O)
        else:
            parts = rows.chunk(len(self.packed_slices), dim=1)  # (N, I / n_slices) each
            out = sum(torch.ops.mkldnn._linear_pointwise(part.contiguous(), w, None, "none", [], "").float()
                      for part, w in zip(parts, self.packed_slices))  # (N, O) fp32, summed left to right
            out = (out if self.bias is None else out + self.bias).to(x.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)  # (N, O) -> (..., O)


def pack_linears(model: torch.nn.Module) -> int:
    """Swap every nn.Linear of an fp32 (or, where this CPU lets oneDNN pack it, bf16) CPU model for a PackedLinear in
    place; returns how many were packed (0 when oneDNN is unavailable, or the model's dtype cannot be packed here)."""
    first = next(model.parameters())
    if not available() or first.device.type != "cpu" or first.dtype not in packed_dtypes(cpu_flags()):
        return 0
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is torch.nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)


Q4_GROUP = 32  # weights per quantisation block along the inner dimension, as GGUF's Q4_0/Q4_1


def int4_available() -> bool:
    ops = torch.ops.aten
    return hasattr(ops, "_convert_weight_to_int4pack_for_cpu") and hasattr(ops, "_weight_int4pack_mm_for_cpu")


def quantize_q4(weight: torch.Tensor, group: int = Q4_GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF's Q4_1 scheme: per block of `group` inner weights, w ~= scale * code + minimum with 4-bit codes,
    minimum = the block's smallest weight and scale = its range / 15. On weights that were Q4_1 to begin with (the
    embedded GGUF, dequantised by transformers) this recovers the file's own codes. Returns codes (O, I) int32 in
    0..15, scale (O, I/group) and minimum (O, I/group), fp32."""
    out_f, in_f = weight.shape
    blocks = weight.detach().float().reshape(out_f, in_f // group, group)  # (O, I/g, g)
    minimum, maximum = blocks.amin(-1), blocks.amax(-1)  # (O, I/g) each
    scale = ((maximum - minimum) / 15).clamp(min=torch.finfo(torch.float32).tiny)  # (O, I/g)
    codes = torch.round((blocks - minimum[..., None]) / scale[..., None]).clamp(0, 15)  # (O, I/g, g)
    return codes.to(torch.int32).reshape(out_f, in_f), scale, minimum


def pack_q4_blocks(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, layout: str = "pairs"
                   ) -> torch.Tensor:
    """quantize_q4's codes in the native step's layout (core/runtime/csrc/lean_step.cpp, q4_mm): per block of 16 outputs
    x 32 inputs, 64 int32 words of codes, then the 16 outputs' scales and minimums as fp16 (8 words each). "pairs" (bf16
    or fp32 pair products): word (q, j) holds output j's inputs 8q .. 8q + 7, input 8q + 2k in bits 4k .., input 8q + 2k
    + 1 in bits 16 + 4k ..; "bytes" (8-bit integer products, AVX2): byte 32m + 4l + i holds output l's code of input 4m
    + i in its low 4 bits and output 8 + l's in its high 4 bits; "quads" (8-bit integer products, AVX512-VNNI): byte 64j
    + 4l + i holds output l's code of input 8j + i in its low 4 bits and of 8j + 4 + i in its high 4 bits. codes (O, I)
    int32 in 0..15, scale, minimum (O, I/32) -> (O/16, I/32, 80) int32"""
    out_f, in_f = codes.shape
    tiles, groups = out_f // 16, in_f // Q4_GROUP
    if layout in ("bytes", "quads"):  # two codes a byte, in the order each kernel loads them
        if layout == "bytes":
            nibbles = codes.to(torch.uint8).reshape(tiles, 2, 8, groups, 8, 4)  # (tile, high, l, group, m, i)
            nibbles = nibbles.permute(0, 3, 4, 2, 5, 1)  # (tile, group, m, l, i, high): 32 bytes per m
        else:
            nibbles = codes.to(torch.uint8).reshape(tiles, 16, groups, 4, 2, 4)  # (tile, l, group, j, high, i)
            nibbles = nibbles.permute(0, 2, 3, 1, 5, 4)  # (tile, group, j, l, i, high): 64 bytes per j
        words = (nibbles[..., 0] | (nibbles[..., 1] << 4)).contiguous().reshape(-1).view(torch.int32)
        words = words.reshape(tiles, groups, 64)
    else:
        nibbles = codes.to(torch.int64).reshape(tiles, 16, groups, 4, 4, 2)  # (tile, j, group, q, k, odd)
        nibbles = nibbles.permute(0, 2, 3, 1, 4, 5)  # (tile, group, q, j, k, odd)
        shifts = 4 * torch.arange(4)[:, None] + 16 * torch.arange(2)[None]  # (k, odd)
        words = (nibbles << shifts).sum((-2, -1))  # (tile, group, q, j), each < 2^32
        words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).reshape(tiles, groups, 64)

    def halves(values: torch.Tensor) -> torch.Tensor:  # (O, I/32) -> (tile, group, 8) int32 holding 16 fp16
        per_block = values.to(torch.float16).reshape(tiles, 16, groups).permute(0, 2, 1)  # (tile, group, 16)
        # viewed as int32 flat: a size-1 dimension's stride (a single block of inputs) blocks a view in place
        return per_block.contiguous().reshape(-1).view(torch.int32).reshape(tiles, groups, 8)

    return torch.cat([words, halves(scale), halves(minimum)], dim=-1).contiguous()  # (tile, group, 80)


def unpack_q4_blocks(blocks: torch.Tensor, layout: str = "pairs") -> torch.Tensor:
    """The weight (O, I) fp32 that pack_q4_blocks' blocks stand for (tests, checks). blocks (O/16, I/32, 80)"""
    tiles, groups, _ = blocks.shape
    if layout == "bytes":
        packed = blocks[..., :64].contiguous().view(torch.uint8).reshape(tiles, groups, 8, 8, 4)  # (tile, g, m, l, i)
        codes = torch.stack([packed & 15, packed >> 4], dim=1)  # (tile, high, group, m, l, i)
        codes = codes.permute(0, 1, 4, 2, 3, 5).reshape(tiles * 16, groups, Q4_GROUP).float()  # (O, I/32, 32)
    elif layout == "quads":
        packed = blocks[..., :64].contiguous().view(torch.uint8).reshape(tiles, groups, 4, 16, 4)  # (tile, g, j, l, i)
        codes = torch.stack([packed & 15, packed >> 4], dim=-2)  # (tile, group, j, l, high, i)
        codes = codes.permute(0, 3, 1, 2, 4, 5).reshape(tiles * 16, groups, Q4_GROUP).float()  # (O, I/32, 32)
    else:
        words = blocks[..., :64].to(torch.int64) & 0xFFFFFFFF  # (tile, group, 64) as unsigned
        words = words.reshape(tiles, groups, 4, 16, 1, 1)  # (tile, group, q, j, 1, 1)
        shifts = 4 * torch.arange(4)[:, None] + 16 * torch.arange(2)[None]  # (k, odd)
        codes = (words >> shifts) & 15  # (tile, group, q, j, k, odd)
        codes = codes.permute(0, 3, 1, 2, 4, 5).reshape(tiles * 16, groups, Q4_GROUP).float()  # (O, I/32, 32)
    scale, minimum = (blocks[..., lo:lo + 8].contiguous().view(torch.float16).float().permute(0, 2, 1)
                      .reshape(tiles * 16, groups, 1) for lo in (64, 72))  # (O, I/32, 1) each
    return (codes * scale + minimum).reshape(tiles * 16, groups * Q4_GROUP)


def as_multiplied(x: torch.Tensor, activations: str, group: int = Q4_GROUP) -> torch.Tensor:
    """The rows x (N, I) as the native products multiply them (its ACTIVATIONS): bf16 as they are; "8-bit" rounded to
    signed codes per block of `group` inputs with the scale max |x| / 127 (GGUF's Q8_0, as llama.cpp treats
    activations). Returns (N, I) fp32 (tests, checks)."""
    x = x.float()
    if activations != "8-bit":
        return x
    blocks = x.reshape(x.shape[0], -1, group)  # (N, I/g, g)
    largest = blocks.abs().amax(-1, keepdim=True)  # (N, I/g, 1)
    inverse = torch.where(largest > 0, 127.0 / largest, torch.zeros_like(largest))
    return (torch.round(blocks * inverse) * (largest / 127.0)).reshape(x.shape)


def quantize_q8(weight: torch.Tensor, group: int = Q4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF's Q8_0 scheme: per block of `group` inner weights, w ~= scale * code with signed 8-bit codes, scale = the
    block's largest magnitude / 127. Returns codes (O, I) int8 and scale (O, I/group) fp32."""
    out_f, in_f = weight.shape
    blocks = weight.detach().float().reshape(out_f, in_f // group, group)  # (O, I/g, g)
    scale = (blocks.abs().amax(-1) / 127).clamp(min=torch.finfo(torch.float32).tiny)  # (O, I/g)
    codes = torch.round(blocks / scale[..., None]).clamp(-127, 127)  # (O, I/g, g)
    return codes.to(torch.int8).reshape(out_f, in_f), scale


def pack_q8_blocks(codes: torch.Tensor, scale: torch.Tensor, layout: str = "pairs") -> torch.Tensor:
    """quantize_q8's codes in the native step's layout (core/runtime/csrc/lean_step.cpp, q8_mm): per block of 16 outputs
    x 32
    inputs, 128 int32 words of codes ("pairs": 8 words per input pair p, output j's codes of inputs 2p, 2p + 1 in
    bytes 2j, 2j + 1; "bytes": word 16m + j holds output j's codes of inputs 4m .. 4m + 3), then the 16 outputs'
    scales as fp16 (8 words). codes (O, I) int8, scale (O, I/32) -> (O/16, I/32, 136)"""
    out_f, in_f = codes.shape
    tiles, groups = out_f // 16, in_f // Q4_GROUP
    per_word = 4 if layout == "bytes" else 2  # consecutive inputs of one output side by side
    pairs = codes.reshape(tiles, 16, groups, 32 // per_word, per_word).permute(0, 2, 3, 1, 4)  # (tile, group, p, j, _)
    words = pairs.contiguous().reshape(-1).view(torch.int32).reshape(tiles, groups, 128)  # 4 bytes a word
    scales = scale.to(torch.float16).reshape(tiles, 16, groups).permute(0, 2, 1)  # (tile, group, 16)
    scales = scales.contiguous().reshape(-1).view(torch.int32).reshape(tiles, groups, 8)
    return torch.cat([words, scales], dim=-1).contiguous()  # (tile, group, 136)


def unpack_q8_blocks(blocks: torch.Tensor, layout: str = "pairs") -> torch.Tensor:
    """The weight (O, I) fp32 that pack_q8_blocks' blocks stand for (tests, checks). blocks (O/16, I/32, 136)"""
    tiles, groups, _ = blocks.shape
    per_word = 4 if layout == "bytes" else 2
    codes = blocks[..., :128].contiguous().view(torch.int8).reshape(tiles, groups, 32 // per_word, 16, per_word)
    codes = codes.permute(0, 3, 1, 2, 4).reshape(tiles * 16, groups, Q4_GROUP).float()  # (O, I/32, 32)
    scale = blocks[..., 128:].contiguous().view(torch.float16).float().permute(0, 2, 1)  # (tile, 16, group)
    return (codes * scale.reshape(tiles * 16, groups, 1)).reshape(tiles * 16, groups * Q4_GROUP)


class Int8Linear(torch.nn.Module):
    """A linear layer from 8-bit weight codes (quantize_q8, GGUF's Q8_0 scheme, the embedded GGUF's own scheme for its
    embedding and LM head) with bf16 activations, by the native step's q8_mm (the module is required: torch has no
    per-block int8 kernel). Used for the LM head in q4: half the bytes of its bf16 copy, which a decode step reads
    whole. Each output row is computed independently of the others."""

    def __init__(self, linear: torch.nn.Linear, native, group: int = Q4_GROUP):
        super().__init__()
        self.in_features, self.out_features, self.native = linear.in_features, linear.out_features, native
        self.blocks = pack_q8_blocks(*quantize_q8(linear.weight, group), native.Q8_LAYOUT)  # (O/16, I/32, 136) int32
        self.bias = None if getattr(linear, "bias", None) is None else linear.bias.detach().to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # (..., I) -> (N, I)
        bias = torch.empty(0, dtype=torch.bfloat16) if self.bias is None else self.bias
        out = self.native.q8_mm(rows, self.blocks, self.out_features, bias)  # (N, O)
        return out.reshape(*x.shape[:-1], self.out_features)  # (N, O) -> (..., O)


class Int4Linear(torch.nn.Module):
    """A linear layer computed from 4-bit weight codes (quantize_q4) with bf16 activations. Inference only.

    With the native step's module (core.runtime.native), by its q4_mm: the codes unpacked once per block for every row
    fed and summed by bf16 pair dot products (AVX512-BF16 where the CPU has it), faster than torch's kernel at 1 to 17
    rows on SmolLM2's shapes (`python -m lab.kernel_timing`; docs/journal/engine.md). Without it, by torch's CPU int4
    kernel, whose dequantisation is w = (code - 8) * scale + zero, so zero = minimum + 8 * scale. Either way each output
    row is computed independently of the others (core.runtime.exactness checks it on the machine)."""

    def __init__(self, linear: torch.nn.Linear, group: int = Q4_GROUP, native=None):
        super().__init__()
        self.in_features, self.out_features, self.group = linear.in_features, linear.out_features, group
        codes, scale, minimum = quantize_q4(linear.weight, group)
        self.native = native if group == Q4_GROUP else None
        self.bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        if self.native is not None:
            self.blocks = pack_q4_blocks(codes, scale, minimum, self.native.LAYOUT)  # (O/16, I/32, 80) int32
            return
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)  # (O, I/2) uint8
        zero = minimum + 8 * scale  # (O, I/g)
        self.scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).contiguous().to(torch.bfloat16)  # (I/g, O, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # (..., I) -> (N, I)
        if self.native is not None:
            bias = torch.empty(0, dtype=torch.bfloat16) if self.bias is None else self.bias
            out = self.native.q4_mm(rows, self.blocks, self.out_features, bias)  # (N, O)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, self.group, self.scales_zeros)
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)  # (N, O) -> (..., O)


def q4_fits(linear: torch.nn.Linear, group: int = Q4_GROUP) -> bool:
    """The int4 kernel's shape rules: whole blocks along the inner dimension, outputs in multiples of 16."""
    return (linear.in_features % group == 0 and linear.out_features % 16 == 0
            and linear.weight.device.type == "cpu" and linear.weight.is_floating_point())
