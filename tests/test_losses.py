"""Training-time samplers of drafter.losses: the distillation jumps (§3.2, §4) and the teacher's times."""
import torch

from drafter import losses
from drafter.flow import t_of_tau, tau_of_t, time_grid

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

    from drafter.network import DraftNet
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
