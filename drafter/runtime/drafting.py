"""Drafting a block from a trained network: flow-map jumps, teacher integration, DFlash-style.

Shape letters: B = blocks, K = slots, V = draft vocabulary, D_t = target width.
Each function returns the per-slot draft distribution (B, K, V) given the noise; the engine's q.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core.verification.sampling import draw_device, sample_rows
from drafter.flow import flow_map_step, time_grid
from drafter.networks.dit import FlowNet
from drafter.runtime.frozen import FrozenDraftNet

DraftingNet = FlowNet | FrozenDraftNet  # a network, or its frozen inference view (drafter.runtime.frozen)


def noise_embedding_factor(net: DraftingNet) -> torch.Tensor:
    """L with L L^T = E^T E: x0 E ~ N(0, E^T E), so g L^T (g ~ N(0, I_{D_t})) draws x0 E without a
    vocabulary-sized noise tensor (the first jump from s = 0 only reads x0 through x0 E)."""
    embed = net.embed_matrix().detach().double()  # (V, D_t)
    gram = embed.T @ embed  # (D_t, D_t)
    eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    return torch.linalg.cholesky(gram + 1e-6 * gram.diagonal().mean() * eye).float()


def one_jump(net: DraftingNet, ctx, mask, block: int, generator, factor: torch.Tensor,
             noise_scale: float = 1.0, noise: torch.Tensor | None = None) -> torch.Tensor:
    """The full jump (0, 1) from x0 ~ N(0, noise_scale^2 I), read through x0 E. noise_scale 0: the jump from
    x0 = 0, the centre of the noise, whose draft is deterministic (the T = 0 path).
    noise: the standard normal g (B, K, D_t) to use instead of drawing it (coupled draws, BlockSampler)."""
    b, dt = ctx.shape[0], net.cfg.target_hidden
    zeros, ones = torch.zeros(b, device=ctx.device), torch.ones(b, device=ctx.device)
    if noise_scale == 0:  # x0 = 0: the raw path RMSNorm(x0 E) is 0, every slot's input is pi_0 E's state
        return net.probs(net.start_state().expand(b, block, dt), zeros, ones, ctx, mask)
    if noise is None:
        noise = torch.randn(b, block, dt, generator=generator, device=draw_device(generator))  # (B, K, D_t)
    g = noise
    x0_embed = noise_scale * g.to(ctx.device) @ factor.T  # (B, K, D_t)
    return net.probs(net.noise_input(x0_embed, ones), zeros, ones, ctx, mask)


def jumps(net: DraftingNet, ctx, mask, block: int, steps: int, generator, diagonal: bool = False,
          noise_scale: float = 1.0, noise: torch.Tensor | None = None) -> torch.Tensor:
    """Compose `steps` jumps on the grid t_n = tau^{-1}(n/N). With diagonal=True the network is used
    as the teacher denoiser D_s (s = t), and each jump is an Euler step (eq. 3 rewritten as eq. 5).
    noise_scale < 1 starts from shrunken noise (a lower-temperature trajectory); 0 from x0 = 0, the teacher's flow
    the zero-noise FlashMap draft is distilled onto (losses.zero_noise_loss). noise: the standard normal (B, K, V)
    to use instead of drawing it."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    if noise is None:
        noise = torch.randn(ctx.shape[0], block, net.cfg.draft_vocab, generator=generator,
                            device=draw_device(generator))  # (B, K, V)
    x0 = noise_scale * noise  # (B, K, V)
    for _x, delta in euler_path(net, ctx, mask, x0.to(ctx.device), steps, diagonal):
        pass
    return delta


def euler_path(net: DraftingNet, ctx, mask, x: torch.Tensor, steps: int, diagonal: bool):
    """Yields (x_n, delta_n) for n = 0..N-1 along the grid t_n = tau^{-1}(n/N) from x_0 = x (B, K, V): the state
    each jump starts from and the network's output there (jumps; diagonal: the teacher's Euler steps)."""
    b = ctx.shape[0]
    grid = time_grid(steps, net.cfg.draft_vocab).to(ctx.device)  # (N+1,)
    for n in range(steps):
        s, t = grid[n].expand(b), grid[n + 1].expand(b)
        t_in = s if diagonal else t
        delta = net.probs(net.state_input(x, s, t_in), s, t_in, ctx, mask)  # (B, K, V)
        yield x, delta
        if n + 1 < steps:  # the last jump's landing point is its output: nothing to step
            x = flow_map_step(x, delta, s, t)  # (B, K, V)


def teacher_flow(teacher: FlowNet, ctx, mask, x0: torch.Tensor, steps: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The teacher's `steps` Euler steps from x0 (B, K, V) on the grid t_n = tau^{-1}(n/N): its state at the midpoint
    u = t_{N/2} = tau^{-1}(1/2), the 2-step sampler's split (None for an odd N), and its last denoiser (what
    `jumps(..., diagonal=True)` returns from the same x0). Every state is (1 - t) x0 plus a mix of denoiser outputs
    of total mass t per slot (eq. 5), so (x_u - (1 - u) x0) / u is a distribution. -> x_u (B, K, V) or None, final"""
    x_mid = None
    for n, (x, delta) in enumerate(euler_path(teacher, ctx, mask, x0, steps, diagonal=True)):
        if 2 * n == steps:
            x_mid = x  # x_{N/2}, the state the (N/2)-th step starts from
    return x_mid, delta


@dataclass(frozen=True)
class NoiseBank:
    """App. B: for M noise draws x0, the parts of the second jump's input that depend only on x0 and
    alpha = u / (1 - u): x0 E, W/S = softmax(alpha x0) E and log S (eq. 10). M = bank size."""

    u: float
    x0_embed: torch.Tensor  # (M, D_t)
    weighted_embed: torch.Tensor  # (M, D_t) W(x0) / S(x0)
    log_s: torch.Tensor  # (M,)
    x0: torch.Tensor | None = None  # (M, V), kept only to test the corrections against the exact jump


def build_noise_bank(net: DraftingNet, size: int, generator, keep_noise: bool = False, chunk: int = 256) -> NoiseBank:
    v = net.cfg.draft_vocab
    u = float(time_grid(2, v)[1])
    alpha = u / (1 - u)
    embed = net.embed_matrix().detach()  # (V, D_t)
    parts = []
    for start in range(0, size, chunk):
        x0 = torch.randn(min(chunk, size - start), v, generator=generator, device=draw_device(generator))  # (m, V)
        parts.append((x0 @ embed, torch.softmax(alpha * x0, -1) @ embed, torch.logsumexp(alpha * x0, -1), x0))
    x0_embed, weighted, log_s, x0 = (torch.cat(p) for p in zip(*parts))
    return NoiseBank(u, x0_embed, weighted, log_s, x0 if keep_noise else None)


def banked_noise(bank: NoiseBank, b: int, block: int, vocab: int, generator, top: int = 16,
                 redraw: bool = True) -> tuple[torch.Tensor, ...]:
    """two_jumps_banked's noise, drawn in its order: each slot's bank entry (B, K) and, with redraw, the noise
    of its top tokens (B, K, T)."""
    idx = torch.randint(len(bank.log_s), (b, block), generator=generator, device=draw_device(generator))  # (B, K)
    if not redraw:
        return (idx,)
    return idx, torch.randn(b, block, min(top, vocab), generator=generator, device=draw_device(generator))  # (B, K, T)


def two_jumps_banked(net: DraftingNet, ctx, mask, block: int, bank: NoiseBank, generator, top: int = 16,
                     redraw: bool = True, noise: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """Two jumps (0 -> u -> 1) reading only `top` rows of E per slot in the second jump (App. B).

    Each slot picks a bank entry; the first jump needs only x0 E. The second jump's posterior
    pi_u(x_u) ∝ exp(alpha x0 + alpha^2 delta) is the bank's W/S plus a correction on the top tokens
    of delta (eq. 10), whose noise is redrawn (or, redraw=False, read from a bank that kept it).
    noise: banked_noise's draw to use instead of drawing it."""
    b, u = ctx.shape[0], bank.u
    alpha = u / (1 - u)
    if noise is None:
        noise = banked_noise(bank, b, block, net.cfg.draft_vocab, generator, top, redraw)
    idx = noise[0]  # (B, K)
    x0_embed, weighted, log_s = bank.x0_embed[idx], bank.weighted_embed[idx], bank.log_s[idx]  # (B,K,D_t) x2, (B,K)
    zeros, us, ones = (torch.full((b,), value) for value in (0.0, u, 1.0))
    delta = net.probs(net.noise_input(x0_embed, us), zeros, us, ctx, mask)  # (B, K, V)
    d_top, top_ids = delta.topk(min(top, delta.shape[-1]), dim=-1)  # (B, K, T)
    if not redraw and bank.x0 is None:
        raise ValueError("redraw=False reads the noise of the top tokens from a bank built with keep_noise")
    z_top = noise[1] if redraw or bank.x0 is None else bank.x0[idx].gather(-1, top_ids)  # (B, K, T)
    e_top = net.embed_matrix()[top_ids]  # (B, K, T, D_t)
    r_over_s = torch.exp(alpha * z_top - log_s[..., None]) * torch.expm1(alpha**2 * d_top)  # (B, K, T)
    posterior_embed = (weighted + (r_over_s[..., None] * e_top).sum(-2)) / (1 + r_over_s.sum(-1, keepdim=True))
    raw_embed = (1 - u) * x0_embed + u * (d_top[..., None] * e_top).sum(-2)  # x_u E on the top tokens
    h = net.state_norm(posterior_embed) + (1 - u) * net.raw_norm(raw_embed)  # eq. 9 with (t - s) = 1 - u
    return net.probs(h, us, ones, ctx, mask)


def masked(net: DraftingNet, ctx, mask, block: int) -> torch.Tensor:
    b = ctx.shape[0]
    zeros = torch.zeros(b, device=ctx.device)
    return net.probs(net.masked_input(b)[:, :block], zeros, zeros, ctx, mask)


def expected_accepted(confidence: torch.Tensor) -> torch.Tensor:
    """sum_k prod_{j<=k} c_j: the expected number of accepted slots if slot k is accepted with
    probability c_k given the slots before it. confidence (..., K) -> (...)."""
    return confidence.cumprod(-1).sum(-1)


@dataclass
class BlockSampler:
    """How a network drafts blocks: the per-slot distribution (B, K, V) for a batch of contexts.

    mode: flowmap (distilled two-time denoiser, `steps` jumps; 2 jumps use the App. B noise bank),
    teacher (`steps` Euler steps of the flow teacher, for analysis) or dflash (one masked pass).
    shared_noise=False is the shuffle test (§6.2): slot k comes from the k-th of K independent draws, coupled to
    the shared draft of the same generator (_shuffled).
    best_of=M drafts M blocks from independent noise in one batched pass (as App. D does for trees)
    and keeps, per context, the one with the largest expected accepted length under its own per-slot
    confidence. The choice reads only the distributions, never a sampled token, so the kept block's
    tokens are still drawn from the q handed to verification: lossless at any temperature.
    """

    net: DraftingNet
    mode: str
    steps: int = 1
    shared_noise: bool = True
    best_of: int = 1
    noise_scale: float = 1.0  # x0's scale (see jumps, one_jump); 0: the deterministic draft from x0 = 0
    bank_size: int = 2048  # 2-step noise bank (the paper uses 8,192 on a GPU)
    _factor: torch.Tensor | None = field(default=None, repr=False)
    _bank: NoiseBank | None = field(default=None, repr=False)
    _fresh: tuple | None = field(default=None, repr=False)  # (generator, the shuffle test's second stream)

    def __post_init__(self):
        if self.mode not in ("flowmap", "teacher", "dflash"):
            raise ValueError(f"unknown drafting mode {self.mode!r}")
        if self.steps < 1 or self.best_of < 1:
            raise ValueError("steps and best_of must be >= 1")
        if self.noise_scale != 1.0 and self.mode == "dflash":
            raise ValueError("noise_scale applies to the flow drafters only")

    def probs(self, ctx: torch.Tensor, mask: torch.Tensor, block: int, generator) -> torch.Tensor:
        """ctx (B, C, D), mask (B, C) -> per-slot distributions (B, K, V)."""
        if self.best_of == 1 or self.mode == "dflash":  # dflash has no noise: its M drafts would be equal
            return self._noise_probs(ctx, mask, block, generator)
        probs = self.draws(ctx, mask, block, generator, self.best_of)  # (B, M, K, V)
        best = expected_accepted(probs.max(-1).values).argmax(-1)  # (B,)
        return probs[torch.arange(ctx.shape[0]), best]  # (B, K, V)

    def draws(self, ctx: torch.Tensor, mask: torch.Tensor, block: int, generator, m: int) -> torch.Tensor:
        """M blocks per context from independent noise, in one batched pass (best-of-M, App. D trees).
        ctx (B, C, D), mask (B, C) -> (B, M, K, V)."""
        rep_ctx, rep_mask = ctx.repeat_interleave(m, 0), mask.repeat_interleave(m, 0)  # (B*M, C, D), (B*M, C)
        return self._noise_probs(rep_ctx, rep_mask, block, generator).view(ctx.shape[0], m, block, -1)

    def _noise_probs(self, ctx, mask, block: int, generator) -> torch.Tensor:
        if self.shared_noise or self.mode == "dflash":
            return self._from_noise(ctx, mask, block, self._draw_noise(ctx.shape[0], block, generator))
        return self._shuffled(ctx, mask, block, generator)

    def _shuffled(self, ctx, mask, block: int, generator) -> torch.Tensor:
        """The shuffle test's draft (§6.2), coupled to the shared-noise draft of the same generator: slot k comes from
        draw k, whose slot-k noise is the noise the shared draft gives slot k (drawn from `generator` exactly as the
        shared draft draws it) and whose other slots' noise is fresh (a second stream). The K draws stay independent,
        so the shuffled draft's distribution is the test's; but with one seed the two drafts differ only through the
        other slots' noise, the joint structure the test measures, and their paired difference loses the variance of
        each slot's own draw (common random numbers). ctx (B, C, D) -> (B, K, V)."""
        b = ctx.shape[0]
        own = self._draw_noise(b, block, generator)  # each (B, K, ...)
        fresh = self._draw_noise(b * block, block, self._fresh_stream(generator))  # each (B*K, K, ...), draw-major
        noise = tuple(couple(o, f, block) for o, f in zip(own, fresh))  # each (B*K, K, ...)
        rep_ctx, rep_mask = ctx.repeat_interleave(block, 0), mask.repeat_interleave(block, 0)  # (B*K, C, D): K draws
        probs = self._from_noise(rep_ctx, rep_mask, block, noise).view(b, block, block, -1)  # (B, draw, K, V)
        return probs.diagonal(dim1=1, dim2=2).permute(0, 2, 1)  # (B, K, V): slot k from draw k

    def _fresh_stream(self, generator):
        if generator is None:
            return None
        if self._fresh is None or self._fresh[0] is not generator:
            self._fresh = (generator, torch.Generator().manual_seed(generator.initial_seed() + 1))
        return self._fresh[1]

    def _banked(self) -> bool:
        return self.mode == "flowmap" and self.steps == 2 and self.noise_scale == 1.0  # the bank holds unit noise

    def _draw_noise(self, b: int, block: int, generator) -> tuple[torch.Tensor, ...]:
        """The noise one draft of B blocks reads, per slot (each tensor (B, K, ...)); () for dflash."""
        if self.mode == "dflash":
            return ()
        if self.mode == "flowmap" and self.steps == 1:
            return (torch.randn(b, block, self.net.cfg.target_hidden, generator=generator,
                                device=draw_device(generator)),)  # (B, K, D_t)
        if self._banked():
            if self._bank is None:
                self._bank = build_noise_bank(self.net, self.bank_size, torch.Generator().manual_seed(0))
            return banked_noise(self._bank, b, block, self.net.cfg.draft_vocab, generator)
        return (torch.randn(b, block, self.net.cfg.draft_vocab, generator=generator,
                            device=draw_device(generator)),)  # (B, K, V)

    def _from_noise(self, ctx, mask, block: int, noise: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self.mode == "dflash":
            return masked(self.net, ctx, mask, block)
        if self.mode == "flowmap" and self.steps == 1:
            if self._factor is None:
                self._factor = noise_embedding_factor(self.net)
            return one_jump(self.net, ctx, mask, block, None, self._factor, self.noise_scale, noise=noise[0])
        if self._banked() and self._bank is not None:  # (built by the draw of this noise)
            return two_jumps_banked(self.net, ctx, mask, block, self._bank, None, noise=noise)
        return jumps(self.net, ctx, mask, block, self.steps, None, diagonal=self.mode == "teacher",
                     noise_scale=self.noise_scale, noise=noise[0])


def couple(own: torch.Tensor, fresh: torch.Tensor, block: int) -> torch.Tensor:
    """Fresh noise of K draws per block with draw k's slot k replaced by that slot's own noise.
    own (B, K, ...), fresh (B*K, K, ...) draw-major -> (B*K, K, ...)."""
    mixed = fresh.reshape(own.shape[0], block, *fresh.shape[1:]).clone()  # (B, draw, K, ...)
    k = torch.arange(block)
    mixed[:, k, k] = own  # draw k, slot k: the shared draft's noise for slot k
    return mixed.flatten(0, 1)  # (B*K, K, ...)


def fold_unused(probs: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Move the mass of draft ids with no target token (padding of a small vocabulary) onto "other"
    (id 0). probs (..., V), real (V,) True where the draft id maps to a target token."""
    if bool(real[1:].all()):  # only "other" itself has no target token: nothing to move
        return probs
    return torch.cat([probs[..., ~real].sum(-1, keepdim=True), probs[..., 1:] * real[1:]], dim=-1)


def greedy_block(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The T=0 proposal: each slot's argmax, valid up to the first slot whose argmax is "other" (id 0).
    probs (..., K, V) -> tokens (..., K), length (...)."""
    tokens = probs.argmax(-1)  # (..., K)
    is_other = tokens == 0
    length = torch.where(is_other.any(-1), is_other.long().argmax(-1), tokens.shape[-1])  # (...,) first "other"
    return tokens, length


def choose_tokens(probs: torch.Tensor, temperature: float, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pick one token per slot from probs (K, V). Index 0 ("other") is never proposed: at T=0 the
    block is cut at the first slot whose argmax is "other"; at T>0 slots sample from q with "other"
    removed and renormalised, and that q is returned for exact rejection sampling."""
    if temperature == 0:
        tokens, length = greedy_block(probs)  # (K,), ()
        return tokens[: int(length)], None
    q_draft = probs.clamp_min(0).pow(1.0 / temperature)  # (K, V)
    q_draft[:, 0] = 0.0
    mass = q_draft.sum(-1, keepdim=True)  # (K, 1)
    usable = (mass[:, 0] > 1e-12).long().cumprod(0).bool()  # (K,) stop where only "other" is left
    q_draft = q_draft[usable] / mass[usable]
    tokens = sample_rows(q_draft.cpu(), generator).to(probs.device)  # (K,)
    return tokens, q_draft
