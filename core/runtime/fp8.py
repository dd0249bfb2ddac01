"""FP8 weights served by torch alone (--quant fp8 on a bf16 checkpoint).

Each decoder linear keeps its weight as float8 e4m3 codes with one fp32 scale per output row; at run time every
input row is quantised the same way (its own amax) and the product is torch._scaled_mm with row-wise scales. One
byte a weight (the memory plan's FP8 row, core.runtime.plan) and no package beyond torch: transformers' own FP8 modules
(FineGrainedFP8Config) fetch a Triton kernel from the Hugging Face hub through the `kernels` package at first use,
which a machine without that package or without network cannot do (docs/gpu.md).

Exactness: a row's scale is its own amax, so each output row depends on its own input row only, as in bf16; the
verify forward over K + 1 positions and the one-position step then differ only by the product kernel's order of
summation, the same caveat bf16 carries (README). The embeddings, norms and LM head stay in the model's dtype.

Shape letters: N = rows (batch x positions), I = in features, O = out features.
"""
from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
ROW_MULTIPLE = 16  # CUDA's scaled products want every dimension a multiple of 16: fed rows are padded up to it
TINY = 1e-12  # the scale of an all-zero row (its codes are zeros whatever the scale)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (R, C) -> codes (R, C) in e4m3 and scale (R, 1) fp32, x ≈ codes * scale, each row scaled by its amax."""
    x32 = x.float()
    scale = x32.abs().amax(dim=-1, keepdim=True).clamp(min=TINY) / FP8_MAX  # (R, 1)
    codes = (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)  # (R, C)
    return codes, scale


class SharedRowCodes:
    """The row codes of one input shared by the linears that read it: q, k and v read the same tensor, and so do gate
    and up, which then quantise it once instead of three times and twice (4 quantisations a layer where there were 7).
    Each quantisation is several small kernels beside its product; at batch 1 on the H200 they were what made FP8 slower
    than bf16 (docs/journal/gpu.md). Keyed by the input's identity: within a layer's forward the same tensor object
    reaches those products unchanged (it is not written in place between them). The group's last linear (v, up) lets the
    entry go, so no activation outlives its layer (a long prefill's would add up over the layers). The codes are the
    ones each linear would make itself: the outputs are bit-identical to unshared ones, in whatever order the group's
    linears are called (one called after the entry went quantises again)."""

    def __init__(self):
        self.last: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (x, codes, scale)

    def codes(self, x: torch.Tensor, make, release: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if self.last is not None and self.last[0] is x:
            codes, scale = self.last[1], self.last[2]
        else:
            codes, scale = make(x)
            self.last = (x, codes, scale)
        if release:
            self.last = None
        return codes, scale


# the linears of a Llama / Qwen3 decoder layer that read one input, in the order the forwards call them
SHARED_INPUTS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class Fp8Linear(torch.nn.Module):
    """A linear layer from e4m3 weight codes (one scale per output row) and per-row e4m3 activations."""

    def __init__(self, linear: torch.nn.Linear, device: torch.device | str | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(device or linear.weight.device)
        codes, scale = quantize_rows(weight)  # (O, I), (O, 1)
        self.weight_codes: torch.Tensor
        self.weight_scale: torch.Tensor
        self.bias: torch.Tensor | None
        self.register_buffer("weight_codes", codes)
        self.register_buffer("weight_scale", scale.reshape(1, -1).contiguous())  # (1, O)
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(weight.device))
        self.out_dtype = weight.dtype
        self.shared: SharedRowCodes | None = None  # row codes shared with the linears reading the same input
        self.releases = False  # the last of those: the shared entry goes after it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n_rows = x.numel() // self.in_features
        if self.shared is not None:
            codes, scale = self.shared.codes(x, self.row_codes, self.releases)
        else:
            codes, scale = self.row_codes(x)
        out = torch._scaled_mm(codes, self.weight_codes.t(), scale_a=scale, scale_b=self.weight_scale,
                               out_dtype=self.out_dtype)  # (N', O), N' = N padded
        out = out[:n_rows]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)  # (..., O)

    def row_codes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (..., I) -> its rows' codes (N', I) and scales (N', 1), the rows padded to ROW_MULTIPLE on CUDA."""
        rows = x.reshape(-1, self.in_features)  # (N, I)
        pad = -rows.shape[0] % ROW_MULTIPLE if rows.is_cuda else 0
        if pad:
            rows = torch.nn.functional.pad(rows, (0, 0, 0, pad))  # zero rows: their own scale, no effect on others
        return quantize_rows(rows)  # (N', I), (N', 1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, e4m3 row-scaled"


def decoder_linears(model) -> list[tuple[torch.nn.Module, str, torch.nn.Linear]]:
    """(parent, attribute, linear) for every nn.Linear inside the decoder layers; the LM head is not among them."""
    found = []
    for layer in model.model.layers:
        for parent in layer.modules():
            for name, child in parent.named_children():
                if type(child) is torch.nn.Linear:
                    found.append((parent, name, child))
    return found


def quantize_decoder(model, device: torch.device, share_codes: bool = True) -> int:
    """Replace the decoder layers' linears by Fp8Linear on `device`, one at a time (each bf16 weight is freed as
    its codes are made, so a model loaded on the host never needs its bf16 copy on the GPU), then move the rest of
    the model there; with share_codes, each layer's linears share one SharedRowCodes. Returns the number replaced."""
    linears = decoder_linears(model)
    for parent, name, linear in linears:
        setattr(parent, name, Fp8Linear(linear, device))
        linear.register_parameter("weight", None)  # the bf16 weight goes now, not when the loop ends
    model.to(device)
    if share_codes:
        share_row_codes(model)
    return len(linears)


def share_row_codes(model, share: bool = True) -> int:
    """The Fp8Linears of each decoder layer that read one input (SHARED_INPUTS) share one SharedRowCodes; share=False
    undoes it (each quantises its input again). Returns the number of groups sharing."""
    groups = 0
    for layer in model.model.layers:
        for parent in layer.modules():
            for names in SHARED_INPUTS:
                group = [m for m in (getattr(parent, name, None) for name in names) if isinstance(m, Fp8Linear)]
                if len(group) != len(names):
                    continue
                shared = SharedRowCodes() if share else None
                for m in group:
                    m.shared, m.releases = shared, m is group[-1]
                groups += share
    return groups


def why_not_fp8(device: torch.device) -> str | None:
    """None where row-scaled e4m3 products run on `device`, else one line saying why not (checked by a real product:
    some GPUs' libraries lack the row-wise variant, e.g. torch's cuBLAS path on sm_120 in 2026)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            return f"FP8 products need compute capability >= 8.9 (Ada/Hopper/Blackwell); this GPU is {major}.{minor}"
    return probe_product(device)


def probe_product(device: torch.device) -> str | None:
    """One small row-scaled product on `device`: None if it runs, else the first line of why not."""
    try:
        probe = Fp8Linear(torch.nn.Linear(32, 32, bias=False, dtype=torch.bfloat16), device)
        probe(torch.ones(1, 32, dtype=torch.bfloat16, device=device))
    except (RuntimeError, NotImplementedError, AssertionError) as err:  # AssertionError: torch built without CUDA
        return f"torch {torch.__version__} cannot run row-scaled FP8 products on {device}: {str(err).splitlines()[0]}"
    return None
