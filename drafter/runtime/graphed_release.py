"""The released FlashMap drafter on the target's device, its proposal one fixed-shape step replayed from a CUDA graph.

Shape letters: K = block size, V = target vocabulary, D_t = target width, L = layers, H = heads, Hd = head dim,
C = the context buffers' capacity, S = the buffer rows a proposal attends over (its span).

Why: an eager proposal launches ~150 small kernels (the DiT's layers, the LM head, the argmax and the softmax), and on
a GPU launching them costs more than their arithmetic while the engine's host loop waits on each; core.runtime.graphs
found the same for the target's own step. A CUDA graph replays a whole proposal with one launch, but only over fixed
shapes and fixed addresses. So, as core.runtime.graphs does for the target:
- the context's cross-attention keys and values live in static buffers (L, H, C, Hd) (`StaticContext`), written at
  their rows when positions are committed (outside the graph: how many arrive varies);
- what changes from one proposal to the next is the contents of a few static tensors: the anchor's id, its
  position, the number of committed rows, and the starting noise (drawn from the engine's generator on the host, as
  the eager drafter draws it, and copied in before the replay);
- the proposal attends over the first S rows of the buffers (S: core.runtime.graphs.attend_span) with a mask that
  hides every row past the anchor's; one step per (steps, span, temperature);
- its outputs stay on the device: the draft's ids, each slot's confidence (its top probability) and, at T > 0, the
  proposal q (K, V) the engine's rejection reads. The host reads K ids and K confidences a round.
Mode "sim" runs the same static step without capture on any device: the tests, and the GPU run's --cpu-sim.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.drafting.base import Draft
from core.runtime.graphs import MIN_SPAN, attend_span, capture
from core.verification.sampling import SamplingConfig, draw_device, sample_rows, top_probs
from drafter.networks.release import ReleaseNet, draft_logits
from drafter.runtime.release import ContextRows, ReleaseDrafter

MODES = ("sim", "cuda")
FIRST_CAPACITY = 4096  # context rows the buffers start with; they double (and the steps are captured again) when full


class StaticContext(ContextRows):
    """Every layer's cross-attention keys and values of the committed positions in buffers at fixed addresses:
    keys, values (L, H, C, Hd), the anchor's row written after the committed ones by the proposal itself. They grow
    only when full (by doubling: new addresses, so `generation` moves on and the captured proposals are dropped)."""

    def __init__(self, capacity: int, shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.capacity, self.shape, self.dtype, self.device = capacity, shape, dtype, device  # shape: (L, H, Hd)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.rows = 0
        self.generation = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keys, values (L, H, N, Hd) of the next N committed positions."""
        end = self.rows + keys.shape[2]
        self.reserve(end + 1)  # + 1: the anchor's row
        all_keys, all_values = self.static_tensors()
        all_keys[:, :, self.rows:end] = keys
        all_values[:, :, self.rows:end] = values
        self.rows = end

    def static_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """keys, values (L, H, C, Hd) (made by the first reserve)."""
        if self.keys is None or self.values is None:
            raise RuntimeError("the context's buffers are not made yet")
        return self.keys, self.values

    def reserve(self, rows: int, like: torch.Tensor | None = None) -> None:
        """Buffers with room for `rows` rows (allocated on first use, doubled while too small)."""
        if self.keys is not None and rows <= self.capacity:
            return
        while self.capacity < rows:
            self.capacity *= 2
        layers, heads, head_dim = self.shape
        keys, values = (torch.zeros(layers, heads, self.capacity, head_dim, dtype=self.dtype, device=self.device)
                        for _ in range(2))
        if self.keys is not None and self.values is not None:
            keys[:, :, :self.rows] = self.keys[:, :, :self.rows]
            values[:, :, :self.rows] = self.values[:, :, :self.rows]
        self.keys, self.values = keys, values
        self.generation += 1


@dataclass
class _Proposal:
    """One captured shape: its static inputs and outputs, and the graph that reads and writes them (None: sim)."""

    anchor: torch.Tensor  # (1,) long
    position: torch.Tensor  # () long: the anchor's position
    rows: torch.Tensor  # () long: committed rows before the anchor's
    noise: torch.Tensor  # (K, D_t): a one-step draft's z ~ N(0, I), or (K, V): the starting state of more steps
    span: int
    temperature: float
    ids: torch.Tensor | None = None  # (K,) long
    confidence: torch.Tensor | None = None  # (K,) fp32
    q_draft: torch.Tensor | None = None  # (K, V) fp32 at T > 0
    logits: torch.Tensor | None = None  # (K, V) fp32
    graph: Any = None  # torch.cuda.CUDAGraph


class GraphedReleaseDrafter(ReleaseDrafter):
    """ReleaseDrafter with static context buffers and a fixed-shape proposal: replayed from a CUDA graph per (steps,
    span, temperature) in mode "cuda", run eagerly in mode "sim". Drafts what ReleaseDrafter drafts from the same
    context and noise (tests/test_graphed_release.py)."""

    def __init__(self, net: ReleaseNet, target, steps: int | None = None, noise_scale: float = 1.0, folder=None,
                 mode: str = "sim", capacity: int = FIRST_CAPACITY, min_span: int = MIN_SPAN):
        if mode not in MODES:
            raise ValueError(f"the graphed drafter's mode must be one of {MODES}, got {mode!r}")
        if mode == "cuda" and net.fc.weight.device.type != "cuda":
            raise ValueError("mode cuda needs the drafter on a CUDA device; mode sim runs the same step here")
        self.mode, self.first_capacity, self.min_span = mode, capacity, min_span
        self.proposals: dict[tuple, _Proposal] = {}
        self.captures = 0  # graphs recorded so far
        super().__init__(net, target, steps, noise_scale, folder, native=False)
        self.trunk_status = f"graphed ({mode})"
        factor = net.noise_factor(self.embedding)[1]  # computed once, before any capture
        # a one-step draft reads its noise only as z @ L^T, z (K, D_t); more steps read the whole state (K, V)
        self.embedded_noise = len(self.grid) == 2 and factor is not None
        self.noise_width = factor.shape[0] if factor is not None and self.embedded_noise else self.embedding.shape[0]
        self.slot_offsets = 1 + torch.arange(self.c.block_size, device=self.device)  # (K,)
        self.head = lambda hidden: self.lm_head(hidden.to(self.head_dtype)).float()  # noqa: E731

    @property
    def buffers(self) -> StaticContext:
        """The context as this drafter holds it: static buffers (reset_context makes them)."""
        assert isinstance(self.context, StaticContext)
        return self.context

    def reset_context(self) -> None:
        """Empty the context; the buffers (and the steps captured over them) stay."""
        if getattr(self, "context", None) is None:
            shape = (self.c.num_hidden_layers, self.c.num_attention_heads, self.c.head_dim)
            self.context = StaticContext(self.first_capacity, shape, self.net.dtype, self.device)
        self.context.rows = 0

    @torch.inference_mode()
    def logits(self, anchor: int, generator: torch.Generator | None = None, noise: torch.Tensor | None = None,
               rows: int | None = None) -> torch.Tensor:
        """The block's draft logits (K, V) through the static step (for tests; `propose` keeps them on the device),
        from `noise` (K, V) where given (steps > 1), else drawn from the generator."""
        if noise is not None and noise.shape[-1] != self.noise_width:
            raise ValueError(f"noise must be (K, {self.noise_width}) for {self.steps} step(s), got "
                             f"{tuple(noise.shape)}")
        logits = self.run(anchor, generator, 0.0, noise).logits
        assert logits is not None  # (written by the run)
        return logits if rows is None else logits[:rows]

    @torch.inference_mode()
    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        proposal = self.run(anchor, generator, sampling.temperature)
        assert proposal.ids is not None and proposal.confidence is not None  # (written by the run)
        confidence = proposal.confidence[:block_size].cpu()  # (K',) fp32: with the ids, what the host reads
        if sampling.greedy or proposal.q_draft is None:
            return Draft(proposal.ids[:block_size].cpu(), None, confidence)
        q_draft = proposal.q_draft[:block_size]  # (K', V) on the device
        return Draft(sample_rows(q_draft, generator).cpu(), q_draft, confidence)

    def run(self, anchor: int, generator: torch.Generator | None, temperature: float,
            noise: torch.Tensor | None = None) -> _Proposal:
        """Fill the static inputs for a proposal after `anchor`, then replay (or run) its step."""
        self.buffers.reserve(self.buffers.rows + 1)
        span = attend_span(self.buffers.rows + 1, self.buffers.capacity, self.min_span)
        proposal = self._proposal(span, temperature)
        proposal.anchor.fill_(anchor)
        proposal.position.fill_(self.position)
        proposal.rows.fill_(self.buffers.rows)
        proposal.noise.copy_(self._noise(generator) if noise is None else noise)
        if proposal.graph is not None:
            proposal.graph.replay()
        else:
            self._outputs(proposal, self.static_propose(proposal))
        return proposal

    def _noise(self, generator: torch.Generator | None) -> torch.Tensor:
        """The starting noise as ReleaseDrafter draws it (draft_logits): z (K, D_t) for one step, else x0 (K, V),
        scaled by noise_scale, on the generator's device, then copied to the buffer."""
        dtype = self.net.dtype if self.embedded_noise else torch.float32
        return self.noise_scale * torch.randn((self.c.block_size, self.noise_width), dtype=dtype, generator=generator,
                                              device=draw_device(generator))

    def _proposal(self, span: int, temperature: float) -> _Proposal:
        key = (span, temperature, self.buffers.generation)
        if key not in self.proposals:
            if any(k[2] != self.buffers.generation for k in self.proposals):  # buffers moved: steps read old ones
                self.proposals.clear()
            long = dict(dtype=torch.long, device=self.device)
            noise_dtype = self.net.dtype if self.embedded_noise else torch.float32
            proposal = _Proposal(torch.zeros(1, **long), torch.zeros((), **long), torch.zeros((), **long),
                                 torch.zeros(self.c.block_size, self.noise_width, dtype=noise_dtype,
                                             device=self.device), span, temperature)
            if self.mode == "cuda":
                self._capture(proposal)
            self.proposals[key] = proposal
        return self.proposals[key]

    def _capture(self, proposal: _Proposal) -> None:
        """Record the step's kernels once (core.runtime.graphs.capture). Its warm-ups write an anchor row at the
        current rows index, which the next commit overwrites."""
        proposal.rows.fill_(self.buffers.rows)
        proposal.graph, _ = capture(lambda: self._outputs(proposal, self.static_propose(proposal)),
                                     device=self.device)
        self.captures += 1

    def _outputs(self, proposal: _Proposal, logits: torch.Tensor) -> None:
        """The draft's ids, confidences and (T > 0) q from its logits (K, V), on the device."""
        proposal.ids, proposal.confidence = top_probs(logits)  # (K,) each
        if proposal.temperature > 0:
            proposal.q_draft = (logits / proposal.temperature).softmax(dim=-1)
        proposal.logits = logits

    def static_propose(self, proposal: _Proposal) -> torch.Tensor:
        """The proposal reading only the static tensors: the anchor's keys and values written at row `rows`, the DiT
        over the span's rows with the rows past the anchor's masked, the jumps -> draft logits (K, V) fp32."""
        net, span = self.net, proposal.span
        anchor_embed = self.embedding.index_select(0, proposal.anchor)  # (1, D_t)
        keys, values = self.cross(net.anchor_input(anchor_embed), proposal.position.view(1))  # (L, H, 1, Hd) each
        all_keys, all_values = self.buffers.static_tensors()
        all_keys.index_copy_(2, proposal.rows.view(1), keys)
        all_values.index_copy_(2, proposal.rows.view(1), values)
        visible = torch.arange(span, device=self.device) <= proposal.rows  # (S,)
        context = list(zip(all_keys[:, :, :span].unbind(0), all_values[:, :, :span].unbind(0)))
        positions = proposal.position + self.slot_offsets  # (K,)
        return draft_logits(net, context, positions, self.embedding, self.head, self.grid, 1.0,
                            mask=visible.view(1, 1, span), noise=None if self.embedded_noise else proposal.noise,
                            embedded_noise=proposal.noise if self.embedded_noise else None)
