"""The lean forward's decode and verify shapes as fixed-shape steps over one persistent static cache, replayed from
CUDA graphs on a GPU.

Why: on the H200 an eager Qwen3-8B-architecture step took several times what reading its bf16 weights takes
(docs/journal/gpu.md): the GPU waits for Python to launch ~15 kernels a layer. A CUDA graph records one forward's
kernels once and replays them with one launch, but only for fixed shapes and fixed memory. So every step of T <= 17 fed
positions (a plain step, a verify chain, a tree) is written with nothing that changes between calls but the contents of
a few input tensors: the tokens, their rotary positions, the cache slots they are written to (index_copy at tensor
indices, not a Python slice) and the number of cached positions; attention runs over a fixed span of the cache's rows
with a mask built from those tensors (gpt-fast's design, which attends over the whole capacity; here the span is the
smallest of 1,024, 2,048, … rows that covers the positions, one step per span: over a 4k-row cache a 17-position step
had cost the H200 more than over a small one, docs/journal/gpu.md). Rolling back stays what it is: moving the cache's
index (a tree path gathered into place first, outside the graph). A prompt's prefill (> 17 positions) runs the lean
forward as before, into the same cache.

On a CPU the same fixed-shape step runs without capture (mode "sim"): what the test suite and the GPU run's
`--cpu-sim` exercise — shapes, masks, slots, rollback and exactness against plain decoding.

Shape letters: T = fed positions (<= 17), S = the cache rows a step attends over (its span), E = hidden size,
H = query heads, G = key/value heads, D = head dim, V = vocabulary, F = concatenated features.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from core.runtime.lean import PREFILL_ROWS, AttentionPlan, LeanForward, StaticCache

GRAPH_MODES = ("auto", "off", "sim", "cuda")  # auto: "cuda" on a GPU with the lean forward, else off
SPARE_SLOTS = PREFILL_ROWS  # capacity kept free past the valid positions: a capture's warm-up writes there
MIN_SPAN = 1024  # the fewest cache rows a step attends over; spans double from here up to the capacity


def attend_span(end: int, capacity: int, min_span: int = MIN_SPAN) -> int:
    """The cache rows a step attends over when its last fed position is end - 1: the smallest min_span * 2^i that
    covers end, at most the capacity. One captured step per span, so a short reply never attends over rows that a
    long one needed the cache for."""
    span = min_span
    while span < end:
        span *= 2
    return min(span, capacity)


def resolve_graphs(requested: str, device: torch.device, lean: bool, fixed_order: bool, native: bool) -> str:
    """The mode a target runs: off without the lean forward or where fixed-order attention or the native step keeps a
    CPU forward exact (the static step attends with sdpa over a mask); "auto" -> "cuda" on a GPU, else "off". Raises
    ValueError with the reason for a mode that cannot run."""
    if requested not in GRAPH_MODES:
        raise ValueError(f"--graphs must be one of {GRAPH_MODES}, got {requested!r}")
    if requested == "off" or (requested == "auto" and (not lean or device.type != "cuda")):
        return "off"
    if not lean:
        raise ValueError("--graphs needs the lean forward (core.runtime.lean); this target runs transformers' forward")
    if fixed_order or native:
        raise ValueError("--graphs replaces attention with sdpa over a mask; this CPU forward stays exact only through "
                         "its fixed-order attention or native step (use --graphs off)")
    if requested == "cuda" and device.type != "cuda":
        raise ValueError("--graphs cuda needs the target on a CUDA device; --graphs sim runs the same step here")
    return "cuda" if requested == "auto" else requested


@dataclass
class _Step:
    """One captured shape: its static inputs and outputs, and the graph that reads and writes them (None: sim)."""

    ids: torch.Tensor  # (T,) long
    positions: torch.Tensor  # (T,) long, rotary positions
    slots: torch.Tensor  # (T,) long, cache rows written
    past: torch.Tensor  # () long, cached positions before this step
    block_visible: torch.Tensor  # (T, T) bool
    span: int = 0  # the cache rows it attends over (attend_span)
    logits: torch.Tensor | None = None  # (T or keep, V)
    features: torch.Tensor | None = None  # (T, F)
    graph: Any = None  # torch.cuda.CUDAGraph


class GraphedSteps:
    """The lean forward with every decode / verify shape (T <= 17) as a fixed-shape step on one persistent cache:
    replayed from a CUDA graph per (T, feature layers, keep, span) in mode "cuda", run eagerly in mode "sim". Called
    as LeanForward is; `new_cache` hands out the persistent cache, emptied, when it has room."""

    def __init__(self, lean: LeanForward, mode: str = "sim", min_span: int = MIN_SPAN, compiled: bool = False):
        """compiled: each shape's step through torch.compile first (inductor fuses the small per-layer work: norms,
        rotary, cache writes, the residual adds), then captured as before; one compilation per shape."""
        if mode not in ("sim", "cuda"):
            raise ValueError(f"GraphedSteps mode must be sim or cuda, got {mode!r}")
        self.lean, self.mode, self.min_span = lean, mode, min_span
        self.forward = self.static_forward
        if compiled:
            from torch import _dynamo

            # every (positions, span, feature layers, keep) is its own compiled step: up to 17 x a few spans
            _dynamo.config.recompile_limit = max(_dynamo.config.recompile_limit, 128)
            self.forward = torch.compile(self.static_forward, dynamic=False, fullgraph=True)
        self.compiled = compiled
        self.cache: StaticCache | None = None
        # the rotary tables the steps read, covering the cache
        self.rope: tuple[torch.Tensor, torch.Tensor] = (torch.empty(0), torch.empty(0))
        self.steps: dict[tuple, _Step] = {}
        self.captures = 0  # graphs recorded so far (each shape once)

    # what the rest of the engine reads of a forward (status line, exactness keys)
    @property
    def weights(self) -> str:
        return self.lean.weights

    @property
    def native(self) -> None:
        return None

    @property
    def fixed_order(self) -> bool:
        return False

    @property
    def native_prefill(self) -> bool:
        """False: a prompt's prefill runs the lean forward's batched kernels where the steps attend with sdpa over a
        mask, so a prefix the steps cached is not bit for bit what prefilling it again gives (core.decoding.prefix
        reuses none)."""
        return False

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.lean.lm_head

    @property
    def device(self) -> torch.device:
        return self.lean.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lean.dtype

    @property
    def static_cache(self) -> StaticCache:
        """The persistent cache the steps write (made by new_cache)."""
        if self.cache is None:
            raise RuntimeError("no cache yet: new_cache makes it")
        return self.cache

    def new_cache(self, capacity: int) -> StaticCache:
        """The persistent cache, emptied; reallocated (and every step recaptured) only when it is too small."""
        if self.cache is None or self.cache.capacity < capacity + SPARE_SLOTS:
            self.cache = None  # the old cache and the graphs over it go first: the two are never held at once
            self.steps.clear()
            self.cache = self.lean.new_cache(capacity + SPARE_SLOTS)
            self.lean.rope_tables(torch.tensor([self.cache.capacity - 1], device=self.lean.device))  # whole table
            _, cos, sin = self.lean._rope[self.lean.dtype]  # (>= S, 1, D) each, kept alive for the graphs
            self.rope = (cos, sin)
        self.cache.length = 0
        return self.cache

    def __call__(self, ids: torch.Tensor | list[int], cache: StaticCache, layers: tuple[int, ...] = (), keep: int = 0,
                 block_visible: torch.Tensor | None = None, positions: torch.Tensor | list[int] | None = None):
        ids = torch.as_tensor(ids, dtype=torch.long)  # (T,) from a list too
        fed, past = ids.shape[0], cache.length
        if cache is not self.cache or fed > PREFILL_ROWS:  # a prefill, or a cache of someone else's
            return self.lean(ids, cache, layers, keep, block_visible, positions)
        if past + fed + SPARE_SLOTS > cache.capacity:
            raise RuntimeError(f"static KV cache full: {past + fed} positions asked of {cache.capacity - SPARE_SLOTS}")
        step = self._step(fed, tuple(layers), keep, attend_span(past + fed, cache.capacity, self.min_span))
        slots = torch.arange(past, past + fed)  # (T,) the cache rows written, and a chain's rotary positions
        step.ids.copy_(ids)
        step.positions.copy_(slots if positions is None else torch.as_tensor(positions))  # a tree's may come as ints
        step.slots.copy_(slots)
        step.past.fill_(past)
        if block_visible is None:
            step.block_visible.copy_(torch.ones(fed, fed, dtype=torch.bool).tril())
        else:
            step.block_visible.copy_(block_visible)
        if step.graph is not None:
            step.graph.replay()
        else:
            step.logits, step.features = self.forward(step, tuple(layers), keep)
        cache.length = past + fed
        assert step.logits is not None  # (written by the run or the replay above)
        features = None if step.features is None else step.features.clone()  # a drafter keeps them
        return step.logits.clone(), features

    def _step(self, fed: int, layers: tuple[int, ...], keep: int, span: int) -> _Step:
        key = (fed, layers, keep, span)
        if key not in self.steps:
            device = self.lean.device
            step = _Step(torch.zeros(fed, dtype=torch.long, device=device),
                         torch.zeros(fed, dtype=torch.long, device=device),
                         torch.zeros(fed, dtype=torch.long, device=device),
                         torch.zeros((), dtype=torch.long, device=device),
                         torch.ones(fed, fed, dtype=torch.bool, device=device).tril(), span)
            if self.mode == "cuda":
                self._capture(step, layers, keep)
            self.steps[key] = step
        return self.steps[key]

    def _capture(self, step: _Step, layers: tuple[int, ...], keep: int) -> None:
        """Record the step's kernels once. Its warm-up runs write the spare slots past the valid positions, which
        nothing attends before a real step overwrites them."""
        capacity, fed = self.static_cache.capacity, step.ids.shape[0]
        step.slots.copy_(torch.arange(capacity - fed, capacity))
        step.positions.copy_(step.slots)
        step.past.fill_(capacity - fed)
        step.graph, (step.logits, step.features) = capture(lambda: self.forward(step, layers, keep),
                                                            device=self.lean.device)
        self.captures += 1

    def static_forward(self, step: _Step, layers: tuple[int, ...], keep: int):
        """The forward of LeanForward.__call__ at a fixed shape, reading only the step's tensors: logits (T or keep,
        V) and features (T, F) or None."""
        lean, base = self.lean, self.lean.base
        cos, sin = self.rope[0][step.positions], self.rope[1][step.positions]  # (T, 1, D) each
        mask = visible_mask(step.past, step.block_visible, step.span)  # (T, S)
        plan = AttentionPlan(0, step.block_visible)  # a decode-sized plan: the layers' fused products, no prefill
        x = embedded = base.embed_tokens(step.ids)  # (T, E)
        states, last = [], len(base.layers)
        for index, layer in enumerate(base.layers):
            x = x + self.attention(index, layer.self_attn, layer.input_layernorm(x), cos, sin, step, mask, plan)
            x = x + lean.mlp(index, layer.mlp, layer.post_attention_layernorm(x), plan)
            if index + 1 in layers and index + 1 < last:
                states.append(x)
        return lean.head(x, embedded, states, layers, keep)  # (T or keep, V), (T, F) or None

    def attention(self, index: int, attn, x: torch.Tensor, cos, sin, step: _Step, mask: torch.Tensor,
                  plan: AttentionPlan) -> torch.Tensor:
        """x (T, E) -> layer `index`'s attention output (T, E); its keys and values written at the step's slots."""
        lean = self.lean
        q, k, v = lean.rotated_qkv(index, attn, x, cos, sin, plan)  # (H, T, D), (G, T, D), (G, T, D)
        keys, values = self.static_cache.keys[index], self.static_cache.values[index]  # (G, capacity, D) each
        keys.index_copy_(1, step.slots, k)  # into the whole cache: a capture's warm-up writes past the span
        values.index_copy_(1, step.slots, v)
        keys, values = keys[:, :step.span], values[:, :step.span]  # (G, S, D) views
        out = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, scale=lean.scale,
                                             enable_gqa=lean.kv_heads != lean.n_heads)[0]  # (H, T, D)
        return lean.output(index, attn, out, plan)  # (T, E)


_POOL: dict[torch.device, object] = {}  # the one memory pool every captured graph of the process draws from


def graph_pool(device: torch.device):
    """The memory pool all graphs on this device are captured into (the target's steps and the drafter's proposals):
    one pool, so graphs that never run at once share their intermediates instead of each keeping its own. Safe
    here because every replay's outputs are copied out (or read) before the next replay."""
    device = torch.device(device)
    if device not in _POOL:
        _POOL[device] = torch.cuda.graph_pool_handle()
    return _POOL[device]


def capture(run, warmups: int = 2, device: torch.device | None = None):
    """Record run()'s kernels once as a CUDA graph into the device's shared pool (graph_pool), after warm-up runs on a
    side stream (the allocator's and the libraries' first-use work stays outside the capture) -> (the graph, what
    the captured run returned: tensors the graph writes on every replay)."""
    device = torch.device(device or torch.device("cuda", torch.cuda.current_device()))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=graph_pool(device)):
        out = run()
    return graph, out


def visible_mask(past: torch.Tensor, block_visible: torch.Tensor, span: int) -> torch.Tensor:
    """(T, S) bool over the cache's first `span` rows: which each fed row attends to — every cached row before `past`,
    and the fed rows (written at past .. past + T - 1) its block_visible (T, T) row allows. Tensor ops only, so a
    graph replays it for any `past`."""
    fed = block_visible.shape[0]
    column = torch.arange(span, device=block_visible.device)  # (S,)
    offset = column - past  # (S,) position within this step's block
    in_block = (offset >= 0) & (offset < fed)  # (S,)
    from_block = block_visible[:, offset.clamp(0, fed - 1)] & in_block  # (T, S)
    return from_block | (column < past)[None]  # (T, S)
