"""A lean forward over a static KV cache for the decoder architectures the engine serves (Llama, Qwen2, Qwen3,
Mistral without sliding windows): the target's own modules and weights, called without transformers' per-call
machinery (mask builders, cache objects, output records).

Why: on a 2-core CPU a decode step of the 135M embedded target spent more time in transformers' per-call Python
(mask creation, DynamicCache updates and crops, hidden-state records, ~25 dispatches a layer) than in its weights;
this module keeps only the tensor ops of the forward (gpt-fast is the model) and a cache rewound by moving an index.

Shape letters: T = positions fed in one forward, P = positions already cached, S = capacity of the static cache,
E = hidden size, H = query heads, G = key/value heads, D = head dim, V = vocabulary, F = concatenated features.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

LEAN_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
# their final norms: x / sqrt(mean(x^2) + eps) * weight, which the native step computes after the layers
NATIVE_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")


def lean_supported(model) -> str | None:
    """None when the lean forward computes this model's forward as transformers does (fp32 logits within 1e-5,
    tests/test_lean.py); else why not. model: the model, or its config."""
    cfg = getattr(model, "config", model)
    if cfg.model_type not in LEAN_MODEL_TYPES:
        return f"architecture {cfg.model_type!r} (lean forward serves {', '.join(LEAN_MODEL_TYPES)})"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", cfg.model_type == "mistral"):
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    return None


def head_dim(config) -> int:
    """A model's attention head width D: its config's own, else hidden size / query heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x (T, N, D) with cos, signed_sin (T, 1, D): rotary position embedding, transformers' x * cos +
    rotate_half(x) * sin written as x * cos + roll(x, D/2) * signed_sin (signed_sin = [-sin_1, sin_2]): the same
    products and sums, three ops fewer."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


# a forward over more positions than any verify round (K + 1 <= 17) is a prompt's prefill: plain and drafted decoding
# run the same one, so it need not be batch-invariant and takes the kernels that are fast for many rows (sdpa; for q4
# the bf16 weights, not the int4 kernel, whose cost grows with every row)
MAX_BLOCK_SIZE = 16  # the largest block K the engine verifies in one round (and the UI offers)
PREFILL_ROWS = MAX_BLOCK_SIZE + 1
KEY_BLOCK = 64  # keys are summed in blocks of this many, aligned to absolute positions (fixed_order_attention)


def round_up(n: int, block: int = KEY_BLOCK) -> int:
    return -(-n // block) * block


def ancestor_columns(past: int, block_visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Where each fed row finds its keys in chain order. block_visible (T, T) bool says which fed positions row i
    sees (a lower triangle for a chain, the ancestors for a tree). Returns, for the tail of the context from the
    last whole KEY_BLOCK before `past` (base) on: index (T, L_t) into [cache base..past, fed 0..T), valid (T, L_t)
    bool, and base. Row i's visible fed positions sit at offsets past - base + depth, in increasing order, which is
    exactly where they would be after a chain of accepted tokens: the same absolute position in the same block."""
    fed = block_visible.shape[0]
    base = past // KEY_BLOCK * KEY_BLOCK
    width = round_up(past - base + fed)
    cached = past - base
    index = torch.zeros(fed, width, dtype=torch.long, device=block_visible.device)  # (T, L_t)
    valid = torch.zeros(fed, width, dtype=torch.bool, device=block_visible.device)  # (T, L_t)
    index[:, :cached] = torch.arange(cached, device=block_visible.device)
    valid[:, :cached] = True
    depth = block_visible.sum(1)  # (T,) positions seen in the block, itself included
    order = torch.argsort((~block_visible).int(), dim=1, stable=True)  # (T, T) visible columns first, in order
    offsets = torch.arange(fed, device=block_visible.device)  # (T,)
    seen = offsets[None] < depth[:, None]  # (T, T)
    index[:, cached:cached + fed] = torch.where(seen, cached + order, 0)
    valid[:, cached:cached + fed] = seen
    return index, valid, base


def fixed_order_attention(q: torch.Tensor, keys: torch.Tensor, values_1: torch.Tensor, plan: "AttentionPlan",
                          scale: float) -> torch.Tensor:
    """Attention whose every output row is bit for bit the same whether its query is fed alone or among others,
    in a chain or a tree (batch-invariant). q (H, T, D); keys (G, S, D) and values_1 (G, S, D + 1) (a column of
    ones after each value) hold plan.past cached positions and then the T fed ones.

    Why this shape of computation: oneDNN's bf16 matrix products give each output element the same value whatever the
    number of rows and however many zero terms trail its sum (core.runtime.exactness checks it on the machine at hand),
    but they pair and group the terms of a sum by their index, and sdpa's kernels and fp32 GEMV/GEMM pick their
    reduction order by shape. So every row's weighted sum is cut into KEY_BLOCK-long pieces aligned to absolute
    positions, each piece a bf16 matmul over keys laid out as a chain would lay them out (a tree row's ancestors
    gathered into place), and the pieces are added one after the other (cumsum); the softmax's max is exact in any
    order, its exponentials elementwise over whole vectors, and its denominator comes out of the same matmuls as the
    numerator, from the ones column, instead of a shape-dependent sum."""
    heads, fed, dim = q.shape
    groups = keys.shape[0]
    rep = heads // groups
    q = (q * scale).view(groups, rep, fed, dim)  # (H, T, D) -> (G, rep, T, D)
    if plan.chain_valid is not None:
        return _chain_attention(q, keys, values_1, plan.chain_valid).view(heads, fed, dim)
    past = plan.past
    if plan.columns is None:
        raise ValueError("fixed-order attention over a tree needs the plan's ancestor columns")
    index, valid, base = plan.columns  # (T, L_t) each
    # the whole blocks before base: the same keys for every row
    head_scores = torch.matmul(q.reshape(groups, rep * fed, dim), keys[:, :base].transpose(1, 2))  # (G, rep*T, B)
    head_scores = head_scores.view(groups, rep, fed, base).float()
    # the tail from base on: each row's own layout
    tail_keys = keys[:, base:past + fed][:, index]  # (G, T, L_t, D)
    tail_values = values_1[:, base:past + fed][:, index]  # (G, T, L_t, D+1)
    tail_scores = torch.matmul(q.transpose(1, 2), tail_keys.transpose(2, 3))  # (G, T, rep, L_t)
    tail_scores = tail_scores.float().masked_fill(~valid[None, :, None], float("-inf"))
    top = torch.maximum(head_scores.amax(-1), tail_scores.amax(-1).transpose(1, 2)) if base else \
        tail_scores.amax(-1).transpose(1, 2)  # (G, rep, T)
    head_w = torch.exp(head_scores - top[..., None]).to(keys.dtype)  # (G, rep, T, B) unnormalised weights
    tail_w = torch.exp(tail_scores - top.transpose(1, 2)[..., None]).to(keys.dtype)  # (G, T, rep, L_t)
    n_head, n_tail = base // KEY_BLOCK, index.shape[1] // KEY_BLOCK
    head_w = head_w.view(groups, rep * fed, n_head, KEY_BLOCK).transpose(1, 2)  # (G, n_h, rep*T, C)
    head_v = values_1[:, :base].view(groups, n_head, KEY_BLOCK, dim + 1)  # (G, n_h, C, D+1)
    head_parts = torch.matmul(head_w, head_v).view(groups, n_head, rep, fed, dim + 1)  # (G, n_h, rep, T, D+1)
    tail_w = tail_w.view(groups, fed, rep, n_tail, KEY_BLOCK).permute(0, 1, 3, 2, 4)  # (G, T, n_t, rep, C)
    tail_v = tail_values.view(groups, fed, n_tail, KEY_BLOCK, dim + 1)  # (G, T, n_t, C, D+1)
    tail_parts = torch.matmul(tail_w, tail_v).permute(0, 2, 3, 1, 4)  # (G, n_t, rep, T, D+1)
    parts = torch.cat([head_parts, tail_parts], dim=1).float()  # (G, n_h + n_t, rep, T, D+1)
    summed = parts.cumsum(1)[:, -1]  # (G, rep, T, D+1): the blocks added in order of position
    out = summed[..., :dim] / summed[..., dim:]  # (G, rep, T, D)
    return out.to(keys.dtype).view(heads, fed, dim)  # (G, rep, T, D) -> (H, T, D)


@dataclass
class StaticCache:
    """Keys and values of every layer in preallocated (G, S, D) tensors; `length` positions are valid.
    Rolling back is moving `length`; nothing is cropped or reallocated."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int = 0
    # the keys' and values' lists as the native step holds them (LeanForward.native_step; made on first use)
    handles: tuple | None = field(default=None, repr=False, compare=False)
    # the native module's keep_rows, where the native step made the handles (keep gathers a tree path with it)
    move_rows: Callable | None = field(default=None, repr=False, compare=False)

    @classmethod
    def empty(cls, n_layers: int, kv_heads: int, capacity: int, head_dim: int, dtype, device,
              ones_column: bool = False) -> "StaticCache":
        """Zeroed keys (G, S, D) and values (G, S, D), or (G, S, D + 1) with a column of ones after each value
        (fixed_order_attention); S is rounded up to whole KEY_BLOCKs."""
        capacity = -(-capacity // KEY_BLOCK) * KEY_BLOCK
        keys = [torch.zeros(kv_heads, capacity, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        values = [torch.zeros(kv_heads, capacity, head_dim + ones_column, dtype=dtype, device=device)
                  for _ in range(n_layers)]
        if ones_column:
            for v in values:
                v[..., head_dim] = 1
        return cls(keys, values)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    def get_seq_length(self) -> int:
        return self.length

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys, values (G, T, D) after the valid positions; return all of them (G, P+T, D) (no advance)."""
        end = self.length + keys.shape[1]
        if end > self.capacity:
            raise RuntimeError(f"static KV cache full: {end} positions asked of {self.capacity}")
        self.keys[layer][:, self.length:end] = keys
        self.values[layer][:, self.length:end, : values.shape[-1]] = values
        return self.keys[layer][:, :end], self.values[layer][:, :end]

    def keep(self, fed: int, kept: list[int]) -> None:
        """After a forward over the last `fed` positions, keep those at indices `kept` (increasing, 0 = the first
        fed): a prefix only moves the index back; a tree path is first gathered into place. Positions past the
        new length are overwritten by the next forward and never attended before that."""
        past = self.length - fed
        if kept == list(range(len(kept))):  # a prefix: nothing moves
            pass
        elif self.move_rows is not None and self.handles is not None:  # the native step's handles: one native call
            self.move_rows(*self.handles, past, kept)
        else:
            src = torch.tensor(kept, device=self.keys[0].device) + past  # (N_kept,)
            span = slice(past, past + len(kept))
            for keys, values in zip(self.keys, self.values):  # (G, S, D)
                keys[:, span] = keys[:, src]
                values[:, span] = values[:, src]
        self.length = past + len(kept)


def _chain_attention(q: torch.Tensor, keys: torch.Tensor, values_1: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """fixed_order_attention for a chain, where every row's keys already sit in chain order: one layout for all
    rows, so no gather. Bit for bit the tree path's result on a chain (the same blocks, the same products).
    q (G, rep, T, D) scaled; valid (T, L) bool over whole key blocks -> (G, rep, T, D)."""
    groups, rep, fed, dim = q.shape
    length = valid.shape[1]
    scores = torch.matmul(q.reshape(groups, rep * fed, dim), keys[:, :length].transpose(1, 2))  # (G, rep*T, L)
    scores = scores.view(groups, rep, fed, length).float().masked_fill(~valid, float("-inf"))
    weights = torch.exp(scores - scores.amax(-1, keepdim=True)).to(keys.dtype)  # (G, rep, T, L) unnormalised
    blocks = length // KEY_BLOCK
    weights = weights.view(groups, rep * fed, blocks, KEY_BLOCK).transpose(1, 2)  # (G, n, rep*T, C)
    parts = torch.matmul(weights, values_1[:, :length].view(groups, blocks, KEY_BLOCK, dim + 1))  # (G, n, rep*T, D+1)
    summed = parts.float().cumsum(1)[:, -1]  # (G, rep*T, D+1): the blocks added in order of position
    out = summed[..., :dim] / summed[..., dim:]  # (G, rep*T, D)
    return out.to(keys.dtype).view(groups, rep, fed, dim)


@dataclass(frozen=True)
class AttentionPlan:
    """What every layer's attention needs of one forward's shape, computed once per forward."""

    past: int
    block_visible: torch.Tensor  # (T, T) bool: fed position j visible to fed row i
    mask: torch.Tensor | None = None  # sdpa: (T, P+T) bool, None when every position is visible (one row)
    # fixed order, a tree: ancestor_columns(past, block_visible)
    columns: tuple[torch.Tensor, torch.Tensor, int] | None = None
    chain_valid: torch.Tensor | None = None  # fixed order, a chain: (T, L) bool over whole key blocks

    @property
    def prefill(self) -> bool:
        return self.block_visible.shape[0] > PREFILL_ROWS


def _is_chain(block_visible: torch.Tensor) -> bool:
    return bool(torch.equal(block_visible, torch.ones_like(block_visible).tril()))


def fuse(linears: list[torch.nn.Linear]) -> torch.nn.Linear:
    """One linear layer computing the given ones side by side on the same input (their weights concatenated)."""
    weight = torch.cat([m.weight.detach() for m in linears])  # (sum O, I)
    fused = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=linears[0].bias is not None,
                            device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(weight)
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([m.bias.detach() for m in linears]))
    return fused.requires_grad_(False)


@dataclass(frozen=True)
class LayerLinears:
    """A decoder layer's products as the lean forward calls them: q, k, v as one, gate and up as one."""

    qkv: torch.nn.Module
    o: torch.nn.Module
    gate_up: torch.nn.Module
    down: torch.nn.Module


def layer_linears(layer, weights: str, native=None) -> LayerLinears | None:
    """weights "packed": on the CPU with prepacked linears (core.runtime.cpu_linear), q, k, v and gate, up fused and
    prepacked, the modules' own packed copies dropped (they fall back to their weights), so memory stays one packed
    copy; "q4": every product from 4-bit codes (core.runtime.cpu_linear.Int4Linear, by the native step's kernel where
    `native` is given); "modules" (a GPU, quantised modules): None, the modules are called as they are."""
    from core.runtime.cpu_linear import Int4Linear, PackedLinear

    attn, mlp = layer.self_attn, layer.mlp
    fusable = [attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj]
    if weights == "q4":
        return LayerLinears(*(Int4Linear(m, native=native) for m in (fuse(fusable[:3]), attn.o_proj,
                                                                        fuse(fusable[3:]), mlp.down_proj)))
    if weights != "packed" or not all(isinstance(m, PackedLinear) for m in fusable):
        return None
    linears = LayerLinears(PackedLinear(fuse(fusable[:3])), attn.o_proj, PackedLinear(fuse(fusable[3:])), mlp.down_proj)
    for m in fusable:
        m.drop_packed()
    return linears


class LeanForward:
    """The target's forward on a StaticCache, with its own weights and modules (norms, projections, MLP)."""

    def __init__(self, model, fixed_order: bool | None = None, weights: str = "packed", native=None,
                 native_prefill: bool = False):
        """fixed_order: attend with fixed_order_attention (None: in bf16 on the CPU, where it makes every
        position's logits independent of how many are fed; elsewhere sdpa). weights: see layer_linears. native: the
        compiled decode step (core.runtime.native), which runs a q4 forward's layers over at most a verify round's
        positions in one call; None: those run here in Python. native_prefill: a prompt's prefill also runs through
        the native step, a verify round's worth of positions at a time (where the CPU has no bf16 products, the
        op-by-op prefill's bf16 weights cost more than the step's own kernel)."""
        why = lean_supported(model)
        if why is not None:
            raise ValueError(f"lean forward does not serve this model: {why}")
        self.model = model
        self.base = model.model
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = head_dim(cfg)
        self.scale = self.head_dim ** -0.5
        # dtype -> (positions covered, cos (S, 1, D), signed sin (S, 1, D))
        self._rope: dict[torch.dtype, tuple[int, torch.Tensor, torch.Tensor]] = {}
        # the fp32 tables as (S, D) views (rope_rows)
        self._rope_rows: tuple[int, torch.Tensor, torch.Tensor] = (0, torch.empty(0), torch.empty(0))
        if fixed_order is None:
            fixed_order = self.device.type == "cpu" and self.dtype == torch.bfloat16
        self.fixed_order = fixed_order
        self.weights = weights
        self.native: Any = native if weights == "q4" else None  # the compiled extension module, untyped
        self.native_prefill = native_prefill and self.native is not None
        self.linears = [layer_linears(layer, weights, self.native) for layer in self.base.layers]
        self.lm_head = self._lm_head(model)
        self._native_weights = self._collect_native_weights() if self.native is not None else []
        self._final_norm = self._native_final_norm()
        # the one-call step (native_step): with the native layers and final norm, the 8-bit LM head and bf16 embeddings
        from core.runtime.cpu_linear import Int8Linear

        self._steps = (self.native is not None and hasattr(self.native, "step") and self._final_norm.numel() > 0
                       and isinstance(self.lm_head, Int8Linear) and self.dtype == torch.bfloat16
                       and self.base.embed_tokens.weight.is_contiguous())
        self._no_mask = torch.empty(0, dtype=torch.bool)  # native_step: a causal chain
        self._weights_handle = (self.native.Tensors(self._native_weights) if self._steps and self.native is not None
                                else None)
        bias = getattr(self.lm_head, "bias", None)
        self._head_bias = torch.empty(0, dtype=torch.bfloat16) if bias is None else bias

    def _lm_head(self, model):
        """The LM head as the forward calls it: in q4 with the native step, from 8-bit codes per block of 32 (GGUF's
        Q8_0, the embedded file's own scheme for it; core.runtime.cpu_linear.Int8Linear), half the bytes of the bf16
        copy a decode step reads whole (the largest single read of a step, docs/journal/engine.md); the prepacked bf16
        copy is then dropped. Else the model's."""
        from core.runtime.cpu_linear import Int8Linear, PackedLinear, q4_fits

        head = model.lm_head
        if self.native is None or not q4_fits(head):
            return head
        if isinstance(head, PackedLinear):
            head.drop_packed()  # its weight stays: tied to the embedding
        return Int8Linear(head, self.native)

    def _native_final_norm(self) -> torch.Tensor:
        """The final norm's weight where the native step applies it after the layers (a bf16 RMSNorm with the layers'
        epsilon, as Llama's and Qwen3's are), so that the rows it returns are normalised; an empty tensor: the model's
        module normalises them (the Python layers, any other norm)."""
        norm = self.base.norm
        weight = getattr(norm, "weight", None)
        eps = getattr(norm, "variance_epsilon", None)
        none = torch.empty(0, dtype=torch.bfloat16)
        if self.native is None or type(norm).__name__ not in NATIVE_NORMS or weight is None:
            return none
        if weight.dtype != torch.bfloat16 or eps != self.base.layers[0].input_layernorm.variance_epsilon:
            return none
        return weight.detach().contiguous()

    @property
    def dtype(self) -> torch.dtype:
        return self.base.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.base.embed_tokens.weight.device

    def new_cache(self, capacity: int) -> StaticCache:
        return StaticCache.empty(len(self.base.layers), self.kv_heads, capacity, self.head_dim, self.dtype,
                                 self.device, ones_column=self.fixed_order)

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype | None = None):
        """cos, signed sin (T, 1, D) at these positions in `dtype` (default the model's), from the model's own rotary
        module (its scaling type included), computed once for a range of positions and then looked up."""
        dtype = dtype or self.dtype
        covered = self._rope[dtype][0] if dtype in self._rope else 0
        need = int(positions.max()) + 1
        if need > covered:
            covered = max(need, 2 * covered, 1024)
            ids = torch.arange(covered, device=self.device)[None]  # (1, S)
            probe = torch.empty(1, dtype=dtype, device=self.device)
            cos, sin = self.base.rotary_emb(probe, ids)  # (1, S, D) each
            half = sin.shape[-1] // 2
            signed = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)[:, None]  # (S, 1, D)
            self._rope[dtype] = (covered, cos[0, :, None], signed)  # (S, 1, D) each
        _, cos, signed = self._rope[dtype]
        return cos[positions], signed[positions]

    def plan(self, past: int, block_visible: torch.Tensor) -> AttentionPlan:
        fed = block_visible.shape[0]
        fixed_order = self.fixed_order and fed <= PREFILL_ROWS
        if fixed_order and _is_chain(block_visible):
            valid = torch.zeros(fed, round_up(past + fed), dtype=torch.bool, device=block_visible.device)  # (T, L)
            valid[:, :past + fed] = torch.cat([valid.new_ones(fed, past), block_visible], dim=1)
            return AttentionPlan(past, block_visible, chain_valid=valid)
        if fixed_order:
            return AttentionPlan(past, block_visible, columns=ancestor_columns(past, block_visible))
        if fed == 1 or (past == 0 and _is_chain(block_visible)):  # all visible, or causal from the start (sdpa's own)
            return AttentionPlan(past, block_visible)
        seen = torch.ones(fed, past, dtype=torch.bool, device=block_visible.device)  # (T, P)
        return AttentionPlan(past, block_visible, mask=torch.cat([seen, block_visible], dim=1))  # (T, P+T)

    def fused(self, index: int) -> LayerLinears:
        """Layer `index`'s fused products (where _by_modules is false)."""
        linears = self.linears[index]
        if linears is None:
            raise RuntimeError(f"layer {index} has no fused products: its own modules serve it")
        return linears

    def _by_modules(self, index: int, plan: AttentionPlan) -> bool:
        """Whether this forward multiplies through the target's own modules: where no fused products exist, and for
        a q4 prefill (its bf16 weights, prepacked; the int4 kernel's cost grows with every row)."""
        return self.linears[index] is None or (plan.prefill and self.weights == "q4")

    def project(self, index: int, attn, x: torch.Tensor, plan: AttentionPlan):
        """x (T, E) -> q (T, H, D), k (T, G, D), v (T, G, D)."""
        fed = x.shape[0]
        if self._by_modules(index, plan):
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        else:
            q, k, v = self.fused(index).qkv(x).split(
                [self.n_heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
        q = q.view(fed, self.n_heads, self.head_dim)  # (T, H*D) -> (T, H, D)
        k = k.view(fed, self.kv_heads, self.head_dim)  # (T, G, D)
        v = v.view(fed, self.kv_heads, self.head_dim)  # (T, G, D)
        return q, k, v

    def attention(self, index: int, attn, x: torch.Tensor, cos, sin, cache: StaticCache,
                  plan: AttentionPlan) -> torch.Tensor:
        """x (T, E) -> attention output (T, E) of layer `index`, its keys and values written to the cache."""
        fed = x.shape[0]
        q, k, v = self.rotated_qkv(index, attn, x, cos, sin, plan)
        keys, values = cache.write(index, k, v)  # (G, P+T, D) each, or D+1 for values
        if self.fixed_order and not plan.prefill:
            out = fixed_order_attention(q, cache.keys[index], cache.values[index], plan, self.scale)  # (H, T, D)
        else:  # values may carry the ones column of fixed-order attention: (G, P+T, D+1) -> (G, P+T, D)
            causal = plan.mask is None and plan.past == 0 and fed > 1
            out = F.scaled_dot_product_attention(q[None], keys[None], values[None, ..., : self.head_dim],
                                                 attn_mask=plan.mask, is_causal=causal, scale=self.scale,
                                                 enable_gqa=self.kv_heads != self.n_heads)[0]
        return self.output(index, attn, out, plan)

    def rotated_qkv(self, index: int, attn, x: torch.Tensor, cos, sin, plan: AttentionPlan):
        """x (T, E) -> q (H, T, D), k (G, T, D) normalised (Qwen3) and rotated, v (G, T, D)."""
        q, k, v = self.project(index, attn, x, plan)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises each head before the rotation
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = apply_rope(q, cos, sin).transpose(0, 1)  # (H, T, D)
        k = apply_rope(k, cos, sin).transpose(0, 1)  # (G, T, D)
        return q, k, v.transpose(0, 1)  # v: (T, G, D) -> (G, T, D)

    def output(self, index: int, attn, out: torch.Tensor, plan: AttentionPlan) -> torch.Tensor:
        """Attention output (H, T, D) -> the layer's o projection (T, E)."""
        fed = out.shape[1]
        o_proj = attn.o_proj if self._by_modules(index, plan) else self.fused(index).o
        return o_proj(out.transpose(0, 1).reshape(fed, self.n_heads * self.head_dim))  # (T, H*D) -> (T, E)

    def mlp(self, index: int, mlp, x: torch.Tensor, plan: AttentionPlan) -> torch.Tensor:
        if self._by_modules(index, plan):
            return mlp(x)
        linears = self.fused(index)
        gate, up = linears.gate_up(x).chunk(2, dim=-1)  # (T, 2 * I_mlp) -> (T, I_mlp) each
        return linears.down(mlp.act_fn(gate) * up)  # (T, E)

    def _collect_native_weights(self) -> list[torch.Tensor]:
        """Each layer's tensors in the order the native step reads them (its Slot enum), an empty tensor for one a
        layer does not have."""
        empty = torch.empty(0, dtype=torch.bfloat16)
        weights = []
        for index, layer in enumerate(self.base.layers):
            attn, linears = layer.self_attn, self.fused(index)
            norms = [getattr(attn, name, None) for name in ("q_norm", "k_norm")]
            products = [[m.blocks, empty if m.bias is None else m.bias]
                        for m in (linears.qkv, linears.o, linears.gate_up, linears.down)]
            weights += [layer.input_layernorm.weight.detach(), *products[0], *products[1],
                        layer.post_attention_layernorm.weight.detach(), *products[2], *products[3],
                        *[empty if n is None else n.weight.detach() for n in norms]]
        if len(weights) != self.native.SLOTS * len(self.base.layers):
            raise ValueError("the native step's tensors per layer do not match its source")
        return [w.contiguous() for w in weights]

    def _native_layers(self, x: torch.Tensor, cache: StaticCache, block_visible: torch.Tensor,
                       positions: torch.Tensor, layers: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """All decoder layers in one native call: x (T, E) -> (T, E) and the states after `layers` (each (T, E))."""
        cos, sin = self.rope_tables(positions, torch.float32)  # (T, 1, D) each
        dim = cos.shape[-1]
        inner = [i for i in layers if 0 < i < len(self.base.layers)]
        eps = self.base.layers[0].input_layernorm.variance_epsilon
        out = self.native.layers(x.contiguous(), cos.reshape(-1, dim).contiguous(), sin.reshape(-1, dim).contiguous(),
                                 block_visible.contiguous(), cache.length, self._native_weights, cache.keys,
                                 cache.values, self.n_heads, self.kv_heads, eps, sorted(inner), self._final_norm)
        return out[0], out[1:]

    def _native_chunks(self, x: torch.Tensor, cache: StaticCache, positions: torch.Tensor,
                       layers: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A causal prefill x (T, E) through the native layers PREFILL_ROWS positions at a time, each chunk after the
        keys of those before it are cached: (T, E) and the states after `layers` (each (T, E))."""
        past, outs, states = cache.length, [], []
        for start in range(0, x.shape[0], PREFILL_ROWS):
            rows = x[start : start + PREFILL_ROWS]  # (T_chunk, E)
            chain = torch.ones(rows.shape[0], rows.shape[0], dtype=torch.bool, device=x.device).tril()
            cache.length = past + start
            out, inner = self._native_layers(rows, cache, chain, positions[start : start + PREFILL_ROWS], layers)
            outs.append(out)
            states.append(inner)
        cache.length = past
        return torch.cat(outs), [torch.cat(chunks) for chunks in zip(*states)]

    def _python_layers(self, x: torch.Tensor, cache: StaticCache, block_visible: torch.Tensor,
                       positions: torch.Tensor, layers: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """All decoder layers op by op: x (T, E) -> (T, E) and the states after `layers` (each (T, E))."""
        plan = self.plan(cache.length, block_visible)
        cos, sin = self.rope_tables(positions)  # (T, 1, D) each
        states, last = [], len(self.base.layers)
        for index, layer in enumerate(self.base.layers):
            x = x + self.attention(index, layer.self_attn, layer.input_layernorm(x), cos, sin, cache, plan)
            x = x + self.mlp(index, layer.mlp, layer.post_attention_layernorm(x), plan)
            if index + 1 in layers and index + 1 < last:
                states.append(x)
        return x, states

    def __call__(self, ids: torch.Tensor | list[int], cache: StaticCache, layers: tuple[int, ...] = (), keep: int = 0,
                 block_visible: torch.Tensor | None = None, positions: torch.Tensor | list[int] | None = None):
        """Feed ids (T,) after the cache's valid positions and advance it by T; return logits (T or keep, V) and
        the hidden states at `layers` (T, F) or None (index 0 = embeddings, i = after decoder layer i, the last
        one normalised as in transformers). block_visible (T, T) bool (which fed positions each fed row sees:
        a tree's ancestors) and positions (T,) default to a causal chain. ids as a list of ints take the one-call
        native step where it serves (native_step)."""
        if isinstance(ids, list) and self._steps and len(ids) <= PREFILL_ROWS:
            return self.native_step(ids, cache, layers, keep, block_visible, positions)
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device)  # (T,)
        fed, past = ids.shape[0], cache.length
        if positions is None:
            positions = torch.arange(past, past + fed, device=ids.device)  # (T,)
        positions = torch.as_tensor(positions, device=ids.device)  # (T,): a tree's positions may come as ints
        if block_visible is None:
            block_visible = torch.ones(fed, fed, dtype=torch.bool, device=ids.device).tril()  # (T, T)
        embedded = self.base.embed_tokens(ids)  # (T, E)
        native = self.native is not None and fed <= PREFILL_ROWS
        chunked = not native and self.native_prefill and torch.equal(block_visible,
                                                                     torch.ones_like(block_visible).tril())
        if native:
            x, inner = self._native_layers(embedded, cache, block_visible, positions, layers)
        elif chunked:
            x, inner = self._native_chunks(embedded, cache, positions, layers)
        else:
            x, inner = self._python_layers(embedded, cache, block_visible, positions, layers)
        cache.length = past + fed
        return self.head(x, embedded, inner, layers, keep, normed=(native or chunked) and self._final_norm.numel() > 0)

    def native_step(self, ids: list[int], cache: StaticCache, layers: tuple[int, ...], keep: int,
                    block_visible: torch.Tensor | None, positions: torch.Tensor | list[int] | None):
        """__call__ for at most PREFILL_ROWS ids in one native call (lean_step.cpp's `step`): embedding, rotary rows,
        causal visibility, the layers, final norm, LM head and features: after a forward has streamed the weights
        through the caches, each small torch op dispatched from Python costs many times its usual few microseconds
        (docs/journal/engine.md, "Measurements behind the code's rules"); the values are the same either way."""
        past, fed = cache.length, len(ids)
        at = [] if positions is None else positions if isinstance(positions, list) else positions.tolist()
        # at (T,): a tree's positions as ints; [] for past, past + 1, ...
        cos, sin = self.rope_rows(max(at, default=past + fed - 1) + 1)  # (S, D) fp32 each
        if cache.handles is None:
            cache.handles = (self.native.Tensors(cache.keys), self.native.Tensors(cache.values))
            cache.move_rows = self.native.keep_rows
        logits, features = self.native.step(
            ids, self.base.embed_tokens.weight, cos, sin, at, self._no_mask if block_visible is None else
            block_visible, past, self._weights_handle, *cache.handles, self.n_heads,
            self.kv_heads, self.base.layers[0].input_layernorm.variance_epsilon, list(layers), self._final_norm,
            self.lm_head.blocks, self.lm_head.out_features, self._head_bias, keep)
        cache.length = past + fed
        return logits, features

    def rope_rows(self, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fp32 rotary tables, cos and signed sin (S, D) each, covering at least `need` positions."""
        if need > self._rope_rows[0]:
            self.rope_tables(torch.tensor([need - 1]), torch.float32)
            covered, cos, sin = self._rope[torch.float32]
            self._rope_rows = (covered, cos.view(covered, -1), sin.view(covered, -1))  # (S, 1, D) -> (S, D) each
        return self._rope_rows[1:]

    def head(self, x: torch.Tensor, embedded: torch.Tensor, inner: list[torch.Tensor], layers: tuple[int, ...],
             keep: int, normed: bool = False):
        """After the decoder layers: x (T, E) -> logits (T or keep, V) and the features at `layers` (T, F) or None,
        from the embeddings (T, E), the inner layers' states and the normalised last one (normed: x is already)."""
        states = ([embedded] if 0 in layers else []) + inner
        if len(self.base.layers) in layers:  # transformers' last hidden state is the normalised one
            x = x if normed else self.base.norm(x)  # (T, E)
            states.append(x)
            x = x if keep == 0 else x[-keep:]
        else:
            x = x if keep == 0 else x[-keep:]  # (T or keep, E)
            x = x if normed else self.base.norm(x)
        logits = self.lm_head(x)  # (T or keep, V)
        features = torch.cat(states, dim=-1) if layers else None  # (T, F)
        return logits, features
