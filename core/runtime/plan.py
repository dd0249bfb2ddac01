"""Memory plan for loading a target on a GPU: weights + KV cache + drafter + working buffers against
free memory, picking the fastest option that fits (bf16 > FP8 > 8-bit LLM.int8, which decodes
several times slower than bf16; FP8 needs compute capability >= 8.9).

Offline planning for the Qwen3 family works from built-in architecture facts.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

GIB = 2**30
# Built-in facts (config.json of each model), so a plan needs no download.
QWEN3_FACTS = {
    "Qwen/Qwen3-4B": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                          head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True),
    "Qwen/Qwen3-8B": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                          head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
    "Qwen/Qwen3-14B": dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                           head_dim=128, intermediate_size=17408, vocab_size=151936, tie_word_embeddings=False),
}
# The FlashMap authors' released drafters (j-shen/FlashMap-Qwen3-8B / -4B, flashmap 0.1.0): a DiT of 6 layers, width
# 2048 (16 heads), MLP 8192, time conditioning 256, reading 5 target layers; bf16 weights
RELEASED_FLASHMAP_DIT = dict(layers=6, width=2048, heads=16, mlp=8192, cond=256, time=256, feature_layers=5)
SPEED_ORDER = ("none", "fp8", "8bit")  # fastest first; "none" = bf16 weights
WORKING_BYTES = int(1.5 * GIB)  # CUDA context, activations, logits over the vocabulary, allocator slack


def estimate_weight_bytes(config, dtype: torch.dtype, quant: str) -> int:
    """Parameter count from the architecture, times bytes per weight (embeddings stay in dtype)."""
    d, n_layers = config.hidden_size, config.num_hidden_layers
    vocab = config.vocab_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", heads) or heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    ffn = config.intermediate_size
    attn = d * head_dim * (heads * 2 + kv_heads * 2)
    mlp = 3 * d * ffn
    layer_params = n_layers * (attn + mlp)
    emb_params = vocab * d * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    dense_bytes = torch.finfo(dtype).bits // 8
    layer_bytes = 1 if quant in ("8bit", "fp8", "int8") else dense_bytes
    return int(layer_params * layer_bytes + emb_params * dense_bytes)


def flashmap_drafter_bytes(target_width: int, context: int, dit: dict = RELEASED_FLASHMAP_DIT,
                           bytes_per_value: int = 2) -> int:
    """A released-architecture FlashMap drafter on the GPU: its weights (fc over the feature layers, the anchor,
    state and output projections, the time MLPs, per layer self- and cross-attention, MLP and three AdaLN maps) and
    its context's cross-attention keys and values for `context` positions (drafter.networks.release). About 1.0 GB
    of weights for Qwen3-8B's 500M-parameter drafter, and 48 KiB a context position."""
    d, mlp, cond, time = dit["width"], dit["mlp"], dit["cond"], dit["time"]
    io = dit["feature_layers"] * target_width * d + 2 * (target_width * d + d) + d * target_width + target_width
    io += 2 * d + 2 * target_width + 1  # the context's, anchor's, state's and noise's RMSNorms, the noise gate
    times = 2 * (time * cond + cond + cond * cond + cond)
    adaln = cond * 3 * d + 3 * d
    layer = 2 * (4 * d * d + 2 * d // dit["heads"]) + 2 * d * mlp + mlp + d + 3 * adaln  # q/k norms per head
    params = io + times + dit["layers"] * layer + adaln
    return params * bytes_per_value + 2 * dit["layers"] * d * context * bytes_per_value


@dataclass(frozen=True)
class Option:
    quant: str
    weights: int
    total: int
    fits: bool
    why: str


@dataclass(frozen=True)
class Plan:
    quant: str | None  # None: nothing fits
    options: tuple[Option, ...]
    free: int

    def describe(self) -> str:
        rows = [f"  {o.quant:>4}: {o.total / GIB:5.1f} GiB ({o.why})" for o in self.options]
        head = f"memory plan, {self.free / GIB:.1f} GiB free:"
        choice = f"-> --quant {self.quant}" if self.quant else "-> nothing fits: lower --context or use a smaller model"
        return "\n".join([head, *rows, choice])


def facts_config(target: str):
    return SimpleNamespace(**QWEN3_FACTS[target]) if target in QWEN3_FACTS else None


def kv_cache_bytes(config, context: int, bytes_per_value: int = 2) -> int:
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * context * bytes_per_value


def plan_rows(config, quant: str, context: int, drafter_bytes: int | None = None,
              dtype: torch.dtype = torch.bfloat16, working: int = WORKING_BYTES) -> dict[str, int]:
    """What the app holds on the device, by row: the target's weights in this precision, its KV cache for `context`
    positions (and the spare rows the fixed-shape steps keep past them), the drafter (None: a released-architecture
    FlashMap drafter at this target's width and context, in `dtype`) and the working memory (activations, the CUDA
    context, allocator slack). core.runtime.memory counts the same rows on a running app."""
    from core.runtime.graphs import SPARE_SLOTS

    value = torch.finfo(dtype).bits // 8
    if drafter_bytes is None:
        drafter_bytes = flashmap_drafter_bytes(config.hidden_size, context, bytes_per_value=value)
    return {"weights": estimate_weight_bytes(config, dtype, quant),
            "kv cache": kv_cache_bytes(config, context + SPARE_SLOTS, value), "drafter": drafter_bytes,
            "working": working}


def plan_memory(config, free_bytes: int, capability: tuple[int, int], context: int = 8192,
                drafter_bytes: int | None = None) -> Plan:
    """Evaluate bf16, FP8 and 8-bit; choose the fastest one that fits in free_bytes. drafter_bytes: what the drafter
    holds (None: a released-architecture FlashMap drafter at this target's width and context)."""
    options = []
    for quant in SPEED_ORDER:
        rows = plan_rows(config, quant, context, drafter_bytes)
        weights, total = rows["weights"], sum(rows.values())
        if quant == "fp8" and capability < (8, 9):
            options.append(Option(quant, weights, total, False, f"needs compute capability 8.9, GPU has "
                                  f"{capability[0]}.{capability[1]}"))
            continue
        fits = total <= free_bytes
        speed = {"none": "bf16, fastest", "fp8": "FP8 weights", "8bit": "LLM.int8, several times slower"}[quant]
        options.append(Option(quant, weights, total, fits, f"{speed}; {'fits' if fits else 'too big'}"))
    chosen = next((o.quant for o in options if o.fits), None)
    return Plan(chosen, tuple(options), free_bytes)
