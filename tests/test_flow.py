import math

import torch

from drafter.flow import (
    decoding_error,
    flow_map_step,
    interpolant,
    posterior,
    semigroup_weight,
    slot_weights,
    t_of_tau,
    tau_of_t,
    time_grid,
)


def test_interpolant_endpoints():
    x0 = torch.randn(2, 3, 5)
    tokens = torch.tensor([[0, 1, 2], [4, 4, 3]])
    assert torch.equal(interpolant(x0, tokens, torch.zeros(2)), x0)
    assert torch.equal(interpolant(x0, tokens, torch.ones(2)), torch.nn.functional.one_hot(tokens, 5).float())


def test_slot_weights_decay_with_kappa_7():
    w = slot_weights(16)
    assert w[0] == 1.0 and math.isclose(float(w[7]), math.exp(-1.0), rel_tol=1e-6)
    assert bool((w[1:] < w[:-1]).all())


def test_tau_is_monotone_from_0_to_1_and_inverts():
    for vocab in (8, 4096, 151936):
        t = torch.linspace(0, 0.999, 500, dtype=torch.float64)
        tau = tau_of_t(t, vocab)
        assert float(tau[0]) == 0.0 and bool((tau[1:] >= tau[:-1]).all()) and float(tau[-1]) > 0.99
        mid = torch.linspace(0.05, 0.95, 19, dtype=torch.float64)
        assert torch.allclose(tau_of_t(t_of_tau(mid, vocab), vocab), mid, atol=2e-3)
        grid = time_grid(4, vocab)
        assert float(grid[0]) == 0.0 and float(grid[-1]) == 1.0 and bool((grid[1:] > grid[:-1]).all())


def test_decoding_error_matches_monte_carlo():
    """P_e(t) of eq. 6 against the empirical argmax error of noised one-hots."""
    gen = torch.Generator().manual_seed(0)
    vocab, n = 50, 40000
    assert math.isclose(float(decoding_error(torch.tensor(0.0), vocab)), 1 - 1 / vocab, abs_tol=1e-3)
    for t in (0.2, 0.4, 0.6):
        x0 = torch.randn(n, vocab, generator=gen)
        state = (1 - t) * x0
        state[:, 0] += t  # the clean token is 0
        empirical = float((state.argmax(-1) != 0).float().mean())
        assert abs(empirical - float(decoding_error(torch.tensor(t), vocab))) < 0.01


def test_featurisation_is_the_exact_posterior():
    """softmax(t x / (1-t)^2) equals Bayes with N(x; t e_c, (1-t)^2 I) and a uniform prior (eq. 8)."""
    gen = torch.Generator().manual_seed(1)
    vocab, t = 7, 0.6
    x = interpolant(torch.randn(1, 4, vocab, generator=gen), torch.tensor([[1, 2, 3, 4]]), torch.tensor([t]))
    onehots = torch.eye(vocab)  # (V, V) candidate clean tokens
    loglik = -((x[0, :, None, :] - t * onehots) ** 2).sum(-1) / (2 * (1 - t) ** 2)  # (K, V)
    exact = torch.softmax(loglik.double(), -1)
    assert torch.allclose(posterior(x, torch.tensor([t]))[0].double(), exact, atol=1e-5)
    assert torch.allclose(posterior(x, torch.tensor([0.0])), torch.full_like(x, 1 / vocab))


def test_flow_map_identity_and_semigroup():
    gen = torch.Generator().manual_seed(2)
    x, delta = torch.randn(3, 2, 5, generator=gen), torch.softmax(torch.randn(3, 2, 5, generator=gen), -1)
    s, u, t = torch.tensor([0.1, 0.0, 0.3]), torch.tensor([0.4, 0.5, 0.6]), torch.tensor([0.9, 1.0, 0.7])
    assert torch.allclose(flow_map_step(x, delta, s, s), x)  # X_{s,s} = id
    # with a constant denoiser the flow is a straight line: X_{u,t} o X_{s,u} = X_{s,t} ...
    two = flow_map_step(flow_map_step(x, delta, s, u), delta, u, t)
    assert torch.allclose(two, flow_map_step(x, delta, s, t), atol=1e-6)
    # ... and the semigroup target of eq. 7 reproduces that denoiser (lambda is a convex weight)
    lam = semigroup_weight(s, u, t)
    assert bool(((lam >= 0) & (lam <= 1)).all())
    assert torch.allclose(flow_map_step(x, delta, s, torch.ones(3)), delta)  # a jump to t = 1 lands on delta
