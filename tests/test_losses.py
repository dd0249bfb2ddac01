"""Training-time samplers of drafter.training.losses: the distillation jumps (§3.2, §4) and the teacher's times."""
import pytest
import torch

from drafter.flow import t_of_tau, tau_of_t, time_grid
from drafter.training import losses

V = 4096


def test_jump_sampler_covers_every_jump_the_samplers_use():
    s, u, t = losses.jump_times(20000, V, torch.Generator().manual_seed(0))
    diag, jump = s == t, s < t
    assert (diag | jump).all() and 0.45 < diag.float().mean() < 0.55
    half = float(time_grid(2, V)[1])  # tau^-1(1/2): the 2-step sampler's first jump ends there
    full = jump & (s == 0) & (t == 1)
    assert abs(full.float().mean() - losses.FULL_JUMP_FRACTION) < 0.01  # (0, 1) jumps, split at tau^-1(1/2)
    assert torch.allclose(u[full], torch.full_like(u[full], half), atol=1e-3)
    from_zero = jump & (s == 0) & (t < 1)
    assert from_zero.float().mean() > 0.05 and (tau_of_t(t[from_zero], V) < 0.1).any()  # (0, u) jumps, short ones too
    assert (diag & (s == 0)).sum() > 500  # the diagonal at (0, 0): where every draft starts
    tau_s = tau_of_t(s[diag & (s > 0)], V)
    assert abs(tau_s.mean() - 0.5) < 0.02 and (tau_s > 0.8).float().mean() > 0.15  # uniform in tau, not Beta(1, 3)
    mid = jump & (t < 1)
    expect = t_of_tau((tau_of_t(s[mid], V) + tau_of_t(t[mid], V)) / 2, V)
    assert torch.allclose(u[mid], expect, atol=2e-3)  # split at the midpoint (in tau)
    assert (s[jump] < u[jump]).all() and (u[jump] < t[jump]).all()


def test_teacher_trains_a_share_of_blocks_at_t_zero(monkeypatch):
    seen = []

    def fake_net_call(_net, _slot_input, s, t, *_ctx):
        seen.append(t.clone())
        raise StopIteration

    from drafter.networks.dit import DraftNet
    from tests.test_drafter import tiny_cfg  # a tiny flashmap config

    cfg = tiny_cfg()
    net = DraftNet(cfg, torch.randn(cfg.draft_vocab, 32), torch.randn(cfg.draft_vocab, 32))
    batch = losses.Blocks.from_windows(torch.randn(2000, 8, 64), torch.ones(2000, 8, dtype=torch.bool),
                                       torch.zeros(2000, dtype=torch.long), torch.randn(2000, 32),
                                       torch.zeros(2000, 4, dtype=torch.long), torch.ones(2000, 4, dtype=torch.bool))
    monkeypatch.setattr(DraftNet, "__call__", fake_net_call)
    for share in (0.0, 0.3):
        try:
            losses.teacher_loss(net, batch, torch.Generator().manual_seed(0), t0_share=share)
        except StopIteration:
            pass
    at_zero = [float((t == 0).float().mean()) for t in seen]
    assert at_zero[0] < 0.01 and 0.26 < at_zero[1] < 0.34


def teacher_student_batch(tiny_target):
    """A batch of tiny blocks and two random (untrained but not degenerate) flow nets, teacher and student."""
    from drafter.data import blocks_from_sequences, draft_vocabulary, target_to_draft_map
    from drafter.runtime.drafters import build_net
    from tests.test_drafter import tiny_cfg, tiny_seqs

    seqs = tiny_seqs()
    vocab_ids = draft_vocabulary(seqs, 16)
    to_draft = target_to_draft_map(vocab_ids, tiny_target.vocab_size)
    batch = blocks_from_sequences(tiny_target, seqs, 4, 4, 8, (1, 2), to_draft, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    teacher, student = (build_net(tiny_cfg(), tiny_target, vocab_ids) for _ in range(2))
    for p in [*teacher.parameters(), *student.parameters()]:
        torch.nn.init.normal_(p, std=0.3)
    return batch, teacher, student


def test_zero_noise_loss_trains_the_draft_the_zero_noise_jump_makes(tiny_target):
    """Its student side is exactly the engine's `flashmap,scale=0` draft, its target the teacher's flow from
    x0 = 0 (drafter.runtime.drafting.jumps): training on it moves the one and only draft toward the teacher's flow."""
    from drafter.runtime.drafting import BlockSampler, jumps

    batch, teacher, student = teacher_student_batch(tiny_target)
    rows = torch.arange(5)
    with torch.no_grad():
        ctx, mask = batch.context(student, rows=rows)
        drafted = BlockSampler(student, "flowmap", noise_scale=0.0).probs(ctx, mask, 4, None)  # (5, K, V)
        t_ctx, t_mask = batch.context(teacher, rows=rows)
        target = jumps(teacher, t_ctx, t_mask, 4, 3, None, diagonal=True, noise_scale=0.0)
        want = losses.weighted_ce(drafted.log(), target, batch.valid[rows], student.cfg.kappa)
        assert torch.allclose(losses.zero_noise_loss(student, teacher, batch, *batch.context(student, pooled=True),
                                                     5, 3), want, atol=1e-5)
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    for _ in range(30):
        opt.zero_grad()
        losses.zero_noise_loss(student, teacher, batch, *batch.context(student, pooled=True), 5, 3).backward()
        opt.step()
    with torch.no_grad():
        after = BlockSampler(student, "flowmap", noise_scale=0.0).probs(ctx, mask, 4, None)
        kl = lambda q: (target * (target.log() - q.log())).sum(-1).mean()  # noqa: E731
        assert kl(after) < 0.5 * kl(drafted)


def test_zero_noise_path_loss_trains_both_zero_noise_drafts_onto_the_teachers_flow(tiny_target):
    """The teacher's flow from x0 = 0 (drafting.teacher_flow from zeros) ends where `jumps` does, and its midpoint state
    over u is a distribution; fitting the path moves the 2-step zero-noise draft (`flashmap,steps=2,scale=0`)
    toward the teacher's flow, as the full jump alone moves the 1-step one."""
    from drafter.runtime.drafting import BlockSampler, jumps, teacher_flow

    batch, teacher, student = teacher_student_batch(tiny_target)
    rows = torch.arange(5)
    with torch.no_grad():
        t_ctx, t_mask = batch.context(teacher, rows=rows)
        x_mid, final = teacher_flow(teacher, t_ctx, t_mask, torch.zeros(5, 4, 16), 4)  # x0 = 0 (5, K, V)
        assert torch.allclose(final, jumps(teacher, t_ctx, t_mask, 4, 4, None, diagonal=True, noise_scale=0.0))
        mid = x_mid / time_grid(2, 16)[1]
        assert mid.min() >= 0 and torch.allclose(mid.sum(-1), torch.ones(5, 4), atol=1e-5)
        ctx, mask = batch.context(student, rows=rows)
    two_step = BlockSampler(student, "flowmap", steps=2, noise_scale=0.0)
    kl = lambda q: (final * (final.log() - q.log())).sum(-1).mean()  # noqa: E731
    with torch.no_grad():
        before = kl(two_step.probs(ctx, mask, 4, None))
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    for _ in range(30):
        opt.zero_grad()
        losses.zero_noise_loss(student, teacher, batch, *batch.context(student, pooled=True), 5, 4,
                               path=True).backward()
        opt.step()
    with torch.no_grad():
        assert kl(two_step.probs(ctx, mask, 4, None)) < 0.5 * before
    with pytest.raises(ValueError, match="even"):
        losses.zero_noise_loss(student, teacher, batch, *batch.context(student, pooled=True), 5, 3, path=True)


def test_teacher_path_loss_trains_the_noisy_2_step_draft_onto_the_teachers_flow_from_its_noise(tiny_target):
    """From a random x0 the teacher's flow (drafting.teacher_flow) ends where `jumps` does from the same noise, its
    midpoint minus the noise left over u is a distribution, and fitting the path moves the student's two exact
    jumps from that x0 (the `flashmap,steps=2` draft) toward the teacher's end: the joint structure §6.2 tests."""
    from drafter.runtime.drafting import jumps, teacher_flow

    batch, teacher, student = teacher_student_batch(tiny_target)
    rows = torch.arange(5)
    x0 = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(3))  # (5, K, V)
    u = time_grid(2, 16)[1]
    with torch.no_grad():
        t_ctx, t_mask = batch.context(teacher, rows=rows)
        x_mid, final = teacher_flow(teacher, t_ctx, t_mask, x0, 4)
        same = jumps(teacher, t_ctx, t_mask, 4, 4, torch.Generator().manual_seed(3), diagonal=True)
        assert torch.allclose(final, same, atol=1e-6)
        mid = (x_mid - (1 - u) * x0) / u
        assert mid.min() >= -1e-5 and torch.allclose(mid.sum(-1), torch.ones(5, 4), atol=1e-4)
        ctx, mask = batch.context(student, rows=rows)
    two_jumps = lambda: jumps(student, ctx, mask, 4, 2, torch.Generator().manual_seed(3))  # noqa: E731
    kl = lambda q: (final * (final.log() - q.log())).sum(-1).mean()  # noqa: E731
    with torch.no_grad():
        before = kl(two_jumps())
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    for _ in range(30):
        opt.zero_grad()
        losses.teacher_path_loss(student, teacher, batch, *batch.context(student, pooled=True), rows, x0, 4).backward()
        opt.step()
    with torch.no_grad():
        assert kl(two_jumps()) < 0.5 * before
    with pytest.raises(ValueError, match="even"):
        losses.teacher_path_loss(student, teacher, batch, *batch.context(student, pooled=True), rows, x0, 3)


def test_distill_loss_adds_the_noise_path_of_the_blocks_after_the_zero_noise_ones(tiny_target):
    batch, teacher, student = teacher_student_batch(tiny_target)
    b, k = batch.tokens.shape
    gen = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    g = gen()
    losses.jump_times(b, 16, g)
    x0 = losses.draw((b, k, 16), g, "cpu", normal=True)  # (B, K, V) the noise distill_loss draws
    rows = torch.arange(2, 5)
    with torch.no_grad():
        plain = losses.distill_loss(student, teacher, batch, gen(), 2, 4, True)
        ctx, mask = batch.context(student, pooled=True)
        extra = losses.teacher_path_loss(student, teacher, batch, ctx, mask, rows, x0[rows], 4)
        both = losses.distill_loss(student, teacher, batch, gen(), 2, 4, True, noise_path_blocks=3)
        assert torch.allclose(both, plain + extra, atol=1e-5)
        clipped = losses.distill_loss(student, teacher, batch, gen(), 2, 4, True, noise_path_blocks=10 * b)
        assert torch.isfinite(clipped)
