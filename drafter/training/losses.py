"""Training objectives for the three stages: flow teacher, flow-map distillation, DFlash-style.

Shape letters: B = blocks, K = slots, V = draft vocabulary, C = context positions, D = drafter width.
A batch is a `Blocks` (drafter/blocks.py): target context and the K clean tokens after each anchor.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from drafter.blocks import Blocks
from drafter.flow import flow_map_step, interpolant, semigroup_weight, slot_weights, t_of_tau, time_grid
from drafter.networks.dit import FlowNet
from drafter.runtime.drafting import teacher_flow

FULL_JUMP_FRACTION = 1 / 16  # §4 Distillation: 1/16 of the jumps are full (0, 1) jumps
FROM_ZERO_FRACTION = 1 / 4  # of the other jumps and of the zero-length ones: start at s = 0, as every draft does


def draw(shape, generator: torch.Generator | None, device, normal: bool = False) -> torch.Tensor:
    """Uniform or normal draws made on the generator's own device, then moved: the same code trains on
    the CPU (tests, this machine) and on a GPU (a generator on the GPU draws the big (B, K, V) noise there)."""
    source = generator.device if generator is not None else torch.device("cpu")
    return (torch.randn if normal else torch.rand)(shape, generator=generator, device=source).to(device)


def weighted_ce(logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, kappa: float) -> torch.Tensor:
    """Per-slot cross-entropy weighted by w_k (§3.1). target: ids (B, K) or soft probs (B, K, V)."""
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, K, V)
    if target.dtype == torch.long:
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, K)
    else:
        nll = -(target * logp).sum(-1)  # (B, K)
    weights = slot_weights(logits.shape[1], kappa).to(logits.device) * valid.float()  # (B, K)
    return (nll * weights).sum() / weights.sum().clamp_min(1e-8)


def teacher_loss(net: FlowNet, batch: Blocks, generator: torch.Generator | None = None,
                 t0_share: float = 0.0) -> torch.Tensor:
    """Flow teacher D_t: each block gets its own t (tau ~ U[0,1] mapped back) and noise (eqs. 2, 4).
    A share `t0_share` of the blocks is trained at exactly t = 0: every draft starts there, yet tau ~ U[0,1]
    through eq. 6 almost never lands below t = 0.5 with a large vocabulary."""
    b, k = batch.tokens.shape
    v = net.cfg.draft_vocab
    device = batch.tokens.device
    tau = draw(b, generator, "cpu")  # (B,)
    tau = torch.where(draw(b, generator, "cpu") < t0_share, torch.zeros_like(tau), tau)
    t = t_of_tau(tau, v).to(device)  # (B,) the tau table lives on the CPU
    x0 = draw((b, k, v), generator, device, normal=True)  # (B, K, V)
    x_t = interpolant(x0, batch.tokens, t)  # (B, K, V)
    logits = net(net.state_input(x_t, t, t), t, t, *batch.context(net, pooled=True))
    return weighted_ce(logits, batch.tokens, batch.valid, net.cfg.kappa)


def dflash_loss(net: FlowNet, batch: Blocks) -> torch.Tensor:
    """DFlash-style baseline: a fully masked block denoised in one pass, per-slot weighted CE."""
    b = batch.tokens.shape[0]
    zeros = torch.zeros(b, device=batch.tokens.device)
    logits = net(net.masked_input(b), zeros, zeros, *batch.context(net, pooled=True))
    return weighted_ce(logits, batch.tokens, batch.valid, net.cfg.kappa)


def jump_times(b: int, vocab: int, generator=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(s, u, t) per block, drawn in tau-space (§3.2, §4). Half are zero-length (s = u = t, tau_s ~ U[0,1],
    a share of them at s = 0, where every draft starts); the rest are jumps s < t of random start and
    length, a share starting at s = 0 (the first jump of every sampler), and FULL_JUMP_FRACTION of all
    blocks the full jump (0, 1). u is the midpoint of tau_s and tau_t, so the full jump's split is
    (0, tau^-1(1/2)) then (tau^-1(1/2), 1): exactly the 2-step sampler's two jumps."""
    zero_len = draw(b, generator, "cpu") < 0.5  # (B,)
    pick = draw(b, generator, "cpu")  # (B,) which kind of non-zero jump
    full = ~zero_len & (pick < 2 * FULL_JUMP_FRACTION)
    from_zero = ~zero_len & ~full & (pick < 2 * FULL_JUMP_FRACTION + FROM_ZERO_FRACTION)
    ends = draw((b, 2), generator, "cpu").sort(dim=1).values  # (B, 2) tau_s <= tau_t
    tau_s, tau_t = ends[:, 0], ends[:, 1]
    tau_s = torch.where(from_zero | full, torch.zeros_like(tau_s), tau_s)
    tau_t = torch.where(full, torch.ones_like(tau_t), tau_t)
    at_zero = zero_len & (draw(b, generator, "cpu") < FROM_ZERO_FRACTION)  # the diagonal (0, 0)
    tau_s = torch.where(zero_len, torch.where(at_zero, torch.zeros_like(tau_s), draw(b, generator, "cpu")), tau_s)
    tau_t = torch.where(zero_len, tau_s, tau_t)
    s, u, t = (t_of_tau(tau, vocab) for tau in (tau_s, (tau_s + tau_t) / 2, tau_t))
    t = torch.where(tau_t >= 1.0, torch.ones_like(t), t)  # the full jump lands exactly on t = 1
    return s, torch.where(zero_len, s, u), t


def semigroup_target(student: FlowNet, x_s, s, u, t, ctx, mask) -> torch.Tensor:
    """sg(lambda delta_{s,u}(I_s) + (1 - lambda) delta_{u,t}(X_{s,u}(I_s))) of eq. 7. -> (B, K, V)"""
    d_su = student.probs(student.state_input(x_s, s, u), s, u, ctx, mask)
    x_u = flow_map_step(x_s, d_su, s, u)  # (B, K, V) the student's first jump
    d_ut = student.probs(student.state_input(x_u, u, t), u, t, ctx, mask)
    lam = semigroup_weight(s, u, t).view(-1, 1, 1).clamp(0.0, 1.0)
    return lam * d_su + (1 - lam) * d_ut


def distill_loss(student: FlowNet, teacher: FlowNet, batch: Blocks, generator=None, zero_noise_blocks: int = 0,
                 zero_noise_steps: int = 16, zero_noise_path: bool = False, noise_path_blocks: int = 0) -> torch.Tensor:
    """Semigroup flow-map distillation (eq. 7). Zero-length jumps match the frozen teacher D_s(I_s);
    longer jumps match the student's own split jump. Each block's target is computed only by the
    path it uses (teacher for s = t, two student jumps otherwise). With zero_noise_blocks, the first that many
    blocks also train the full jump from x0 = 0 onto the teacher's flow from 0 (zero_noise_loss; with
    zero_noise_path, the 2-step sampler's two jumps along that flow too). With noise_path_blocks, the next that many
    blocks fit their jumps from their own random x0 to the teacher's flow from it (teacher_path_loss)."""
    b, k = batch.tokens.shape
    v = student.cfg.draft_vocab
    device = batch.tokens.device
    s, u, t = (time.to(device) for time in jump_times(b, v, generator))
    x0 = draw((b, k, v), generator, device, normal=True)  # (B, K, V)
    x_s = interpolant(x0, batch.tokens, s)  # (B, K, V)
    ctx, mask = batch.context(student, pooled=True)
    diag = s == t  # (B,) zero-length jumps
    jump = ~diag
    with torch.no_grad():
        target = torch.empty(b, k, v, device=device)
        if diag.any():
            t_ctx, t_mask = batch.context(teacher, rows=diag, pooled=True)
            sd = s[diag]
            target[diag] = teacher.probs(teacher.state_input(x_s[diag], sd, sd), sd, sd, t_ctx, t_mask)
        if jump.any():
            target[jump] = semigroup_target(student, x_s[jump], s[jump], u[jump], t[jump], ctx[jump], mask[jump])
    logits = student(student.state_input(x_s, s, t), s, t, ctx, mask)
    loss = weighted_ce(logits, target, batch.valid, student.cfg.kappa)
    if zero_noise_blocks:
        loss = loss + zero_noise_loss(student, teacher, batch, ctx, mask, zero_noise_blocks, zero_noise_steps,
                                      zero_noise_path)
    if noise_path_blocks:
        rows = torch.arange(zero_noise_blocks, min(zero_noise_blocks + noise_path_blocks, b), device=device)  # (N,)
        if len(rows):
            loss = loss + teacher_path_loss(student, teacher, batch, ctx, mask, rows, x0[rows], zero_noise_steps)
    return loss


def zero_noise_loss(student: FlowNet, teacher: FlowNet, batch: Blocks, ctx, mask, n_blocks: int, steps: int,
                    path: bool = False) -> torch.Tensor:
    """The flow map's defining property at the one start every T = 0 draft can share, x0 = 0: its full jump
    delta_{0,1}(0) is the end D of the teacher's own flow from 0 (eq. 5; the teacher's `steps` Euler steps, the
    last denoiser as a soft target). From x0 = 0 the teacher's flow beats its one-pass t = 0 guess, where from
    random noise it loses to it (the teacher gate): this trains the student on the path it drafts.
    path: also the 2-step draft's two jumps along that flow (teacher_path_loss). ctx, mask: the student's context
    of every block (batch.context(student, pooled=True)), read for the first n_blocks."""
    rows = torch.arange(min(n_blocks, batch.tokens.shape[0]), device=batch.tokens.device)  # (Z,) the first blocks
    x0 = torch.zeros(len(rows), batch.tokens.shape[1], student.cfg.draft_vocab, device=rows.device)  # (Z, K, V)
    return teacher_path_loss(student, teacher, batch, ctx, mask, rows, x0, steps, path)


def teacher_path_loss(student: FlowNet, teacher: FlowNet, batch: Blocks, ctx, mask, rows: torch.Tensor,
                      x0: torch.Tensor, steps: int, path: bool = True) -> torch.Tensor:
    """Fit the student's jumps from x0 (Z, K, V) to the teacher's own flow from that x0, for the blocks `rows`:
    the full jump delta_{0,1}(x0) onto the flow's end D, and with path the 2-step sampler's two jumps, split at
    u = tau^-1(1/2): X_{0,u}(x0) = (1 - u) x0 + u delta_{0,u}(x0) = x_u, so delta_{0,u} learns (x_u - (1 - u) x0) / u,
    and delta_{u,1}(x_u) = D. Every target is the teacher's flow itself (a flow map is its solution operator),
    not the student's bootstrap of eq. 7. From random x0 this is where the joint structure the shuffle test
    measures (§6.2) lives: slot k's end depends on every slot's noise through the teacher's attention."""
    with torch.no_grad():
        t_ctx, t_mask = batch.context(teacher, rows=rows, pooled=True)
        x_mid, final = teacher_flow(teacher, t_ctx, t_mask, x0, steps)  # (Z, K, V) x2
    ctx, mask, valid = ctx[rows], mask[rows], batch.valid[rows]
    z, dev, kappa = len(rows), rows.device, student.cfg.kappa
    zeros, ones = torch.zeros(z, device=dev), torch.ones(z, device=dev)
    full = weighted_ce(student(student.state_input(x0, zeros, ones), zeros, ones, ctx, mask), final, valid, kappa)
    if not path:
        return full
    if x_mid is None:
        raise ValueError("the teacher's path needs an even number of teacher steps (its midpoint)")
    u = time_grid(2, student.cfg.draft_vocab)[1].to(dev).expand(z)  # (Z,) the 2-step split, t_{N/2} of the grid
    first_target = (x_mid - (1 - u.view(-1, 1, 1)) * x0) / u.view(-1, 1, 1)  # (Z, K, V) delta_{0,u}'s target
    first = weighted_ce(student(student.state_input(x0, zeros, u), zeros, u, ctx, mask), first_target, valid, kappa)
    second = weighted_ce(student(student.state_input(x_mid, u, ones), u, ones, ctx, mask), final, valid, kappa)
    return full + (first + second) / 2
